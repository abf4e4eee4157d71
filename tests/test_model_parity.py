"""The target model matches transformers.LlamaForCausalLM and captures the right aux layers."""
import pytest
import torch
from transformers import LlamaConfig as HFConfig
from transformers import LlamaForCausalLM

from models.llama import load_target


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_llama")
    torch.manual_seed(0)
    cfg = HFConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                   rope_theta=5000.0)
    hf = LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(path)
    return hf, path


def test_logits_match_transformers_fp32(hf_pair):
    hf, path = hf_pair
    ours = load_target(path)
    tokens = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        ref = hf(tokens).logits
        out = ours(tokens).logits
    assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4), (out - ref).abs().max()


# The last layer is left out: HF applies the final norm to hidden_states[L].
@pytest.mark.parametrize("ids", [[0, 2, 4], [1, 2, 3], [4, 1, 3]])
def test_aux_ids_are_layer_outputs(hf_pair, ids):
    """ids [a, b, c] return the outputs of layers a, b, c (HF hidden_states[i + 1]), in that order."""
    hf, path = hf_pair
    ours = load_target(path, aux_layer_ids=ids)
    tokens = torch.randint(0, 300, (1, 16))
    with torch.no_grad():
        states = hf(tokens, output_hidden_states=True).hidden_states
        aux = ours(tokens, capture_aux=True).aux_hidden
    expected = torch.cat([states[i + 1] for i in ids], dim=-1)
    assert torch.allclose(aux, expected, atol=1e-5)


def test_default_aux_ids():
    from models.aux_layers import default_aux_layer_ids
    assert default_aux_layer_ids(8) == [1, 3, 4]
    assert default_aux_layer_ids(61) == [1, 29, 57]


@pytest.mark.parametrize("form", ["auto", "written_out"])
def test_cached_decoding_matches_full_forward(hf_pair, form):
    """Prefill + one-token steps through the static cache give the full-sequence logits, with SDPA
    (what "auto" takes on CPU) and with attention written out (what compiled CUDA steps take)."""
    from engine.masks import block_inputs, causal
    from models.kernel_plan import KernelPlan
    from models.layers import set_kernel_plan
    _, path = hf_pair
    ours = load_target(path)
    set_kernel_plan(KernelPlan(attention=form), ours)
    ours.setup_cache(max_batch=1, max_len=64)
    tokens = torch.randint(0, 300, (1, 20))
    with torch.no_grad():
        full = ours(tokens).logits
        zero = torch.zeros(1, dtype=torch.long)
        pre = ours(tokens[:, :12], block_inputs(zero, causal(1, 12, "cpu"), torch.arange(12).unsqueeze(0), 64)).logits
        steps = [ours(tokens[:, i:i + 1], block_inputs(torch.tensor([i]), torch.ones(1, 1, 1, dtype=torch.bool),
                                                        torch.zeros(1, 1, dtype=torch.long), 64)).logits
                 for i in range(12, 20)]
    assert torch.allclose(pre, full[:, :12], atol=1e-5)
    assert torch.allclose(torch.cat(steps, 1), full[:, 12:], atol=1e-5)


def test_written_out_attention_matches_sdpa():
    """Grouped queries folded into the query length, under an arbitrary mask per batch row (a
    draft tree's): the same attention as SDPA with enable_gqa."""
    import torch.nn.functional as F

    from models.layers import written_out_attention
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 9, 5, 64), torch.randn(2, 3, 40, 64), torch.randn(2, 3, 40, 64)
    mask = torch.rand(2, 1, 5, 40) > 0.5
    mask[..., 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.allclose(written_out_attention(q, k, v, mask), ref, atol=1e-5, rtol=1e-5)


def test_fused_projections_keep_logits_and_greedy_tokens(hf_pair):
    """q/k/v and gate/up fused into one GEMM each (what the engine serves): same logits as
    transformers, same greedy tokens through the static cache as the unfused model."""
    from engine.decoder import BatchDecoder
    from engine.sampling import BatchSampling
    from models.layers import fuse_projections

    hf, path = hf_pair
    plain, fused = load_target(path), fuse_projections(load_target(path))
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n, _ in fused.named_parameters())
    tokens = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        assert torch.allclose(fused(tokens).logits, hf(tokens).logits, atol=1e-4, rtol=1e-4)
    greedy = BatchSampling.all_greedy_rows(1, "cpu")
    outs = []
    for model in (plain, fused):
        dec = BatchDecoder(model, None, None, max_batch=1, max_context=100)
        out = [dec.prefill(0, tokens[0, :10].tolist(), greedy)]
        out += [dec.step(1, greedy)[0].tokens[0] for _ in range(30)]
        outs.append(out)
    assert outs[0] == outs[1]


def test_one_token_gemv_as_reduction_matches_linear():
    """The form models.layers.Linear takes for one token under torch.compile on GPU: the same
    product as F.linear, accumulated in fp32 (bf16 inputs: as close to the fp32 product as
    cuBLAS's bf16 GEMV is)."""
    import torch.nn.functional as F

    from models.layers import gemv_reduction
    torch.manual_seed(0)
    x, w, b = torch.randn(1, 1, 512), torch.randn(384, 512) / 16, torch.randn(384)
    assert torch.allclose(gemv_reduction(x, w, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5)
    exact = F.linear(x.bfloat16().float(), w.bfloat16().float())
    ours = gemv_reduction(x.bfloat16(), w.bfloat16())
    assert ours.dtype == torch.bfloat16
    assert (ours.float() - exact).abs().max() <= (F.linear(x.bfloat16(), w.bfloat16()).float() - exact).abs().max() * 2
