"""Build the training corpus (and tokenizer) for the shipped small target model.

Everything comes from Python source on this machine; nothing is downloaded.

Sources
  * the standard library of the running interpreter (``sysconfig`` "stdlib" path), every
    ``*.py`` recursively, without test folders, site-/dist-packages and the generated
    charmap codec tables;
  * the Python source of a fixed list of installed packages (``--packages``, default
    DEFAULT_PACKAGES below; ``--packages ''`` for the standard library alone), found in
    site-packages (test folders and vendored copies excluded), with their versions recorded.

Samples
  * ``doc``: a module's source as plain text;
  * ``chat`` (task ``doc``): from every top-level function or class method with a docstring,
    a user turn (signature and docstring, in one of a few phrasings) and an assistant turn
    (the function's code in a ```python fence```);
  * ``chat`` (task ``sig``, off with ``--no-sig-prompts``): the same for functions without a
    docstring, the user turn naming the signature and the module.
  Duplicated code (vendored copies, identical files) is kept once.

Held out for evaluation (never trained on)
  every module whose dotted name (``json.decoder``, ``numpy.linalg``) hashes to bucket 0 of
  ``--holdout-buckets`` (md5 of the name, as an integer, modulo the bucket count; default 20),
  and any held-out function whose code also occurs in a training file. The module list is
  written to ``<data-dir>/heldout_modules.txt``; held-out prompts use task ``doc`` only.

Outputs
  ``<out-dir>/corpus.jsonl.gz``   one JSON object a line:
        {"split": "train"|"heldout", "kind": "doc", "source": ..., "module": ..., "text": ...}
        {"split": ..., "kind": "chat", "source": ..., "module": ..., "messages": [user, assistant]}
  ``<out-dir>/train_prompts.jsonl`` every training chat prompt, {"messages": [{"role": "user", ...}]},
        in a fixed shuffled order (the first N lines are a random subset of size N);
  ``<out-dir>/tokenizer/``        byte-level BPE + ChatML template (models.tokenizer), trained on the
        training split (skipped with ``--vocab-size 0``);
  ``<out-dir>/manifest.json``     sources, versions, counts, sizes, hashes, the command;
  ``--heldout-prompts``          (default shipped/data/heldout_prompts.jsonl) up to
        ``--num-heldout-prompts`` held-out chat prompts, {"messages": [user]};
  ``--data-dir``                 (default shipped/data) heldout_modules.txt and a copy of the manifest.

Usage (from the repository root):
  python shipped/build_corpus.py                                   # the shipped corpus
  python shipped/build_corpus.py --max-files 20 --out-dir /tmp/c --data-dir /tmp/c --vocab-size 512
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import random
import site
import sys
import sysconfig
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Installed packages whose source joins the standard library (permissive licences; about 10 MB
# of the gzipped corpus). Their versions go into the manifest.
DEFAULT_PACKAGES = ["numpy", "matplotlib", "networkx", "huggingface_hub", "_pytest", "setuptools", "pip",
                    "pydantic", "rich", "aiohttp", "jinja2", "click", "httpx", "PIL", "mpmath"]
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
             "_vendor", "vendor", "_vendored", "vendored", "externals", "_distutils_hack"}
MAX_FILE_BYTES = 800_000          # larger files are generated tables
MAX_DOC_CHARS = 1500              # docstring shown in a prompt
MIN_DOC_CHARS = 16
MIN_LINES, MAX_LINES = 4, 80      # function length (decorators to last line)
MAX_CODE_CHARS = 3500

FUNC_PROMPTS = [
    "Write a Python function `{sig}`.\n\n{doc}",
    "Implement the Python function `{sig}`. Its docstring:\n\n{doc}",
    "Write a Python function `{sig}` that does the following:\n\n{doc}",
    "Write `{sig}` in Python.\n\n{doc}",
]
NODOC_FUNC_PROMPTS = [
    "Write a Python function `{sig}` for the module `{module}`.",
    "Write the function `{sig}` of the Python module `{module}`.",
]
NODOC_METHOD_PROMPTS = [
    "Write the method `{sig}` of the Python class `{cls}` (module `{module}`).",
    "Implement `{cls}.{sig}` for the Python module `{module}`.",
]
METHOD_PROMPTS = [
    "Write the method `{sig}` of the Python class `{cls}`.\n\n{doc}",
    "Implement `{cls}.{sig}` in Python. Its docstring:\n\n{doc}",
    "Write a method `{sig}` for the class `{cls}` that does the following:\n\n{doc}",
]


def stable_hash(s: str) -> int:
    return int(hashlib.md5(s.encode("utf-8")).hexdigest(), 16)


def is_heldout_module(module: str, buckets: int) -> bool:
    return buckets > 0 and stable_hash(module) % buckets == 0


@dataclass
class SourceFile:
    path: Path
    rel: str          # path relative to its root, '/'-separated
    source: str       # "stdlib" or "site:<dist>"
    module: str       # dotted module name


def module_name(rel: str) -> str:
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__init__"


def walk_py(root: Path, prefix: str = "") -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for f in sorted(filenames):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                out.append(prefix + rel)
    return sorted(out)


def stdlib_files() -> list[SourceFile]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [SourceFile(root / rel, rel, "stdlib", module_name(rel)) for rel in walk_py(root)]


def site_dirs() -> list[Path]:
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
    seen, out = set(), []
    for d in dirs:
        p = Path(d)
        if p.is_dir() and p.name in ("site-packages", "dist-packages") and p.resolve() not in seen:
            seen.add(p.resolve())
            out.append(p)
    return out


def package_files(name: str) -> tuple[list[SourceFile], str]:
    """Files of an installed top-level package `name` and its distribution version."""
    for d in site_dirs():
        root = d / name
        if (root / "__init__.py").is_file():
            dists = importlib.metadata.packages_distributions().get(name, [name])
            try:
                version = f"{dists[0]} {importlib.metadata.version(dists[0])}"
            except importlib.metadata.PackageNotFoundError:
                version = "unknown"
            files = [SourceFile(d / rel, rel, f"site:{name}", module_name(rel)) for rel in walk_py(root, name + "/")]
            return files, version
    raise SystemExit(f"--packages: {name!r} is not an installed package in {[str(d) for d in site_dirs()]}")


def read_source(f: SourceFile) -> str | None:
    try:
        if f.path.stat().st_size > MAX_FILE_BYTES:
            return None
        text = f.path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "decoding_table = (" in text or "\x00" in text:  # charmap codec tables, binary junk
        return None
    return text


def _is_trivial(body: list[ast.stmt]) -> bool:
    if len(body) != 1:
        return False
    s = body[0]
    if isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)):
        return True
    return isinstance(s, ast.Raise) and "NotImplementedError" in ast.unparse(s)


def short_doc(doc: str) -> str:
    doc = doc.strip()
    if len(doc) <= MAX_DOC_CHARS:
        return doc
    cut = doc.rfind("\n\n", 0, MAX_DOC_CHARS)
    return doc[: cut if cut > MIN_DOC_CHARS else MAX_DOC_CHARS].rstrip()


def code_key(code: str) -> str:
    return hashlib.sha1("\n".join(line.rstrip() for line in code.strip().splitlines()).encode()).hexdigest()


def functions(tree: ast.Module):
    """(class name or None, node) for top-level functions and methods of top-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield None, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield node.name, sub


def function_code(lines: list[str], node) -> str:
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return textwrap.dedent("\n".join(lines[start - 1: node.end_lineno])).strip("\n")


def chat_pairs(f: SourceFile, text: str, tree: ast.Module, with_nodoc: bool) -> list[dict]:
    lines = text.splitlines()
    out = []
    for cls, node in functions(tree):
        name = node.name
        if name.startswith("__") and name != "__init__":
            continue
        doc = ast.get_docstring(node)
        if doc and len(doc.strip()) >= MIN_DOC_CHARS:
            task, body = "doc", node.body[1:]  # without the docstring
        elif with_nodoc and not doc:
            task, body = "sig", node.body
        else:
            continue
        if not body or _is_trivial(body):
            continue
        code = function_code(lines, node)
        n_lines = code.count("\n") + 1
        if not (MIN_LINES <= n_lines <= MAX_LINES) or len(code) > MAX_CODE_CHARS:
            continue
        sig = f"{name}({ast.unparse(node.args)})"
        if node.returns is not None:
            sig += f" -> {ast.unparse(node.returns)}"
        if isinstance(node, ast.AsyncFunctionDef):
            sig = "async " + sig
        qual = f"{f.module}.{cls + '.' if cls else ''}{name}"
        if task == "doc":
            templates = METHOD_PROMPTS if cls else FUNC_PROMPTS
        else:
            templates = NODOC_METHOD_PROMPTS if cls else NODOC_FUNC_PROMPTS
        prompt = templates[stable_hash(qual) % len(templates)].format(sig=sig, cls=cls, module=f.module,
                                                                      doc=short_doc(doc or ""))
        out.append({"kind": "chat", "task": task, "source": f.source, "module": f.module, "qualname": qual,
                    "messages": [{"role": "user", "content": prompt},
                                 {"role": "assistant", "content": f"```python\n{code}\n```"}],
                    "_key": code_key(code)})
    return out


def all_function_keys(text: str, tree: ast.Module) -> set[str]:
    lines = text.splitlines()
    return {code_key(function_code(lines, n)) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def select_subset(files: list[SourceFile], max_files: int, buckets: int) -> list[SourceFile]:
    """Evenly spaced files, half training and half held-out modules (for quick smoke runs)."""
    held = [f for f in files if is_heldout_module(f.module, buckets)]
    train = [f for f in files if f not in held]
    def spread(xs, n):
        if n >= len(xs):
            return xs
        return [xs[int(i * len(xs) / n)] for i in range(n)]
    n_held = min(len(held), max_files // 2)
    return spread(train, max_files - n_held) + spread(held, n_held)


def render_plain(messages: list[dict]) -> str:
    return "\n".join(m["content"] for m in messages)


def rel(path: Path | str) -> str:
    """A path relative to the repository when it lies inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(REPO / "runs" / "shipped"))
    ap.add_argument("--data-dir", default=str(REPO / "shipped" / "data"),
                    help="committed small files: heldout_modules.txt, corpus_manifest.json")
    ap.add_argument("--heldout-prompts", default=None, help="default: <data-dir>/heldout_prompts.jsonl")
    ap.add_argument("--packages", default=",".join(DEFAULT_PACKAGES),
                    help="comma-separated installed packages to add from site-packages ('' for stdlib only)")
    ap.add_argument("--no-sig-prompts", action="store_true",
                    help="chat pairs only from functions with docstrings (no signature-only prompts)")
    ap.add_argument("--holdout-buckets", type=int, default=20)
    ap.add_argument("--num-heldout-prompts", type=int, default=400)
    ap.add_argument("--vocab-size", type=int, default=6144, help="0: do not build the tokenizer")
    ap.add_argument("--max-files", type=int, default=0, help="smoke runs: use only this many files")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.time()
    out_dir, data_dir = Path(args.out_dir), Path(args.data_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    heldout_path = Path(args.heldout_prompts) if args.heldout_prompts else data_dir / "heldout_prompts.jsonl"

    files = stdlib_files()
    versions = {"python": platform.python_version()}
    for name in [p.strip() for p in args.packages.split(",") if p.strip()]:
        pf, versions[name] = package_files(name)
        files += pf
    if args.max_files:
        files = select_subset(files, args.max_files, args.holdout_buckets)

    docs, chats, train_keys, seen_docs, skipped = [], [], set(), set(), 0
    held_modules = set()
    for f in files:
        text = read_source(f)
        if text is None or not text.strip():
            skipped += 1
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            tree = None
        split = "heldout" if is_heldout_module(f.module, args.holdout_buckets) else "train"
        if split == "heldout":
            held_modules.add(f.module)
        digest = hashlib.sha1(text.encode()).hexdigest()
        if digest in seen_docs:
            continue
        seen_docs.add(digest)
        doc_index = len(docs)
        docs.append({"split": split, "kind": "doc", "source": f.source, "module": f.module,
                     "path": f.rel, "text": text})
        if tree is None:
            continue
        if split == "train":
            train_keys |= all_function_keys(text, tree)
        for c in chat_pairs(f, text, tree, with_nodoc=not args.no_sig_prompts):
            c["split"] = split
            c["_doc"] = doc_index
            chats.append(c)

    # One copy of each function's code (training copies first); held-out functions must not
    # occur in any training file.
    keep, seen_code, leaked = set(), set(), 0
    for i in sorted(range(len(chats)), key=lambda i: chats[i]["split"] != "train"):
        key = chats[i]["_key"]
        if key in seen_code:
            continue
        seen_code.add(key)
        if chats[i]["split"] == "heldout" and key in train_keys:
            leaked += 1
            continue
        keep.add(i)
    chats = [c for i, c in enumerate(chats) if i in keep]
    by_doc: dict[int, list[dict]] = {}
    for c in chats:
        c.pop("_key")
        by_doc.setdefault(c.pop("_doc"), []).append(c)

    rng = random.Random(args.seed)
    train_chats = [c for c in chats if c["split"] == "train"]
    held_chats = [c for c in chats if c["split"] == "heldout" and c["task"] == "doc"]
    order = list(range(len(train_chats)))
    rng.shuffle(order)
    with open(out_dir / "train_prompts.jsonl", "w") as fh:
        for i in order:
            fh.write(json.dumps({"messages": train_chats[i]["messages"][:1]}) + "\n")
    held_sample = sorted(held_chats, key=lambda c: stable_hash(c["qualname"]))[: args.num_heldout_prompts]
    held_sample.sort(key=lambda c: c["qualname"])
    with open(heldout_path, "w") as fh:
        for c in held_sample:
            fh.write(json.dumps({"messages": c["messages"][:1]}) + "\n")

    corpus_path = out_dir / "corpus.jsonl.gz"
    # No name or time in the gzip header: the same sources give the same bytes.
    with open(corpus_path, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8") as fh:
        for i, doc in enumerate(docs):  # each module's chat pairs right after it: gzip shares the code
            for rec in [doc] + by_doc.get(i, []):
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    (data_dir / "heldout_modules.txt").write_text(
        f"# Held-out modules: md5(dotted name) % {args.holdout_buckets} == 0 "
        f"(Python {platform.python_version()}).\n" + "".join(m + "\n" for m in sorted(held_modules)))

    def chars(rows, key):
        return sum(len(r["text"]) if key == "doc" else len(render_plain(r["messages"])) for r in rows)

    stats = {}
    for split in ("train", "heldout"):
        d = [r for r in docs if r["split"] == split]
        c = [r for r in chats if r["split"] == split]
        stats[split] = {"docs": len(d), "doc_chars": chars(d, "doc"), "chats": len(c), "chat_chars": chars(c, "chat")}

    tok_info = None
    if args.vocab_size:
        from models.tokenizer import build_tokenizer
        train_texts = [r["text"] for r in docs if r["split"] == "train"] + \
                      [render_plain(r["messages"]) for r in train_chats]
        tok = build_tokenizer(train_texts, args.vocab_size, out_dir / "tokenizer")
        n_tok = {}
        for split in ("train", "heldout"):
            texts = [r["text"] for r in docs if r["split"] == split] + \
                    [tok.apply_chat_template(r["messages"], tokenize=False) for r in chats if r["split"] == split]
            n_tok[split] = sum(len(e.ids) for e in tok.backend_tokenizer.encode_batch(texts))
            stats[split]["tokens"] = n_tok[split]
        tok_info = {"dir": rel(out_dir / "tokenizer"), "vocab_size": len(tok),
                    "chars_per_token": round(sum(stats["train"][k] for k in ("doc_chars", "chat_chars"))
                                             / max(1, n_tok["train"]), 3)}

    manifest = {
        "script": "shipped/build_corpus.py",
        "command": "python " + " ".join([os.path.relpath(__file__, REPO)]
                                        + (argv if argv is not None else sys.argv[1:])),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(time.time() - t0, 1),
        "versions": versions,
        "stdlib_path": sysconfig.get_paths()["stdlib"],
        "packages": [p for p in versions if p != "python"],
        "files_seen": len(files), "files_skipped": skipped,
        "holdout_rule": f"modules with md5(dotted name) % {args.holdout_buckets} == 0; "
                        "held-out functions whose code occurs in a training file are dropped",
        "heldout_modules": sorted(held_modules),
        "heldout_functions_dropped_as_leaked": leaked,
        "stats": stats,
        "tokenizer": tok_info,
        "files": {
            "corpus": {"path": rel(corpus_path), "bytes": corpus_path.stat().st_size, "sha256": sha256(corpus_path)},
            "train_prompts": {"path": rel(out_dir / "train_prompts.jsonl"), "count": len(train_chats),
                              "bytes": (out_dir / "train_prompts.jsonl").stat().st_size},
            "heldout_prompts": {"path": rel(heldout_path), "count": len(held_sample),
                                "sha256": sha256(heldout_path)},
        },
    }
    text = json.dumps(manifest, indent=1)
    (out_dir / "manifest.json").write_text(text)
    (data_dir / "corpus_manifest.json").write_text(text)
    print(json.dumps({"stats": stats, "tokenizer": tok_info, "corpus_bytes": corpus_path.stat().st_size,
                      "train_prompts": len(train_chats), "heldout_prompts": len(held_sample),
                      "heldout_modules": len(held_modules), "seconds": manifest["build_seconds"]}, indent=1))
    return manifest


if __name__ == "__main__":
    main()
