# The 0-draft server against --no-spec at 4 requests over HTTP, each sampled by py-spy for 12 s under
# load (pip install py-spy). README.md counts, in the two .raw files here, the samples whose stack holds a function. Session 32, AMD EPYC VM.
#   bash benchmarks/results/batch_sweep/zero_steps_s32/profile_c4.sh
set -e
mkdir -p ${OUT:-/tmp/zero_steps_profile}
P=benchmarks/results/batch_sweep/cpu_http/prompts.jsonl
.venv/bin/specserve --profile cpu-default --port 8795 > ${OUT:-/tmp/zero_steps_profile}/table.log 2>&1 &
T=$!
.venv/bin/python -c "from benchmarks.server_proc import wait_healthy; wait_healthy('http://127.0.0.1:8795', timeout_s=600)"
.venv/bin/specserve --profile cpu-default --no-spec --port 8796 > ${OUT:-/tmp/zero_steps_profile}/plain.log 2>&1 &
Q=$!
.venv/bin/python -c "from benchmarks.server_proc import wait_healthy; wait_healthy('http://127.0.0.1:8796', timeout_s=600)"
for side in table plain; do
  port=$([ $side = table ] && echo 8795 || echo 8796); pid=$([ $side = table ] && echo $T || echo $Q)
  .venv/bin/python -m benchmarks.serving --base-url http://127.0.0.1:$port --max-concurrency 4 --num-prompts 18 --prompts $P --max-tokens 128 --warmup 1 --out-dir ${OUT:-/tmp/zero_steps_profile} --name ${side}_c4 > ${OUT:-/tmp/zero_steps_profile}/${side}_c4.txt &
  L=$!
  sleep 3
  .venv/bin/py-spy record --pid $pid --subprocesses --duration 12 --rate 200 --format raw --output ${OUT:-/tmp/zero_steps_profile}/${side}.raw --nonblocking > /dev/null 2>&1 || true
  wait $L
  grep -i "output token throughput\|throughput" ${OUT:-/tmp/zero_steps_profile}/${side}_c4.txt | head -2
done
kill $T $Q
