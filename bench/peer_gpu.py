"""The peers on an NVIDIA GPU:
`python peer_gpu.py {train,generate,ctranslate2} --peers-dir DIR ...`.

The peer scripts in ../shared/tools/peers time transformers and CTranslate2 on the CPU only.
This script times the same model (the peers' `common.build_marian`: same configuration, seed
and random batches) with the same fixed work and the same JSON fields, on CUDA device 0:

  train        a MarianMTModel training step: forward, backward, Adam (lr 1e-4, betas 0.9/0.98,
               eps 1e-9; PyTorch's fused CUDA Adam), label smoothing 0.1. --dtype bfloat16 runs
               forward and backward under torch.autocast("cuda", bfloat16) with float32 master
               weights, the same split of work as ours; float32 allows TF32 matrix products, as
               JAX does by default on GPUs. Batches are made on the GPU before the timer; each
               timed step ends with torch.cuda.synchronize().
  generate     transformers generate(), greedy and beam search, with the model's weights in
               --dtype (model.to(bfloat16): how transformers users run inference), exactly
               --out-len tokens per sentence, synchronized before the timer stops.
  ctranslate2  the model converted with the peers' converter (ct2_decode.convert) and decoded by
               ctranslate2.Translator(device="cuda", compute_type=each of --compute-types). If
               CTranslate2 cannot use the GPU here (no CUDA build, or its CUDA libraries are
               missing), one line {"system": "ctranslate2", "unavailable": reason} is printed.

Runs with a python that has torch with CUDA and transformers (the peers' python on a GPU
machine); it imports nothing of this project. `bench/common.py:run_peer` calls it when JAX's
default device is a GPU.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def parse_args(argv):
    modes = ("train", "generate", "ctranslate2")
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        raise SystemExit(0)
    if len(argv) < 3 or argv[0] not in modes or argv[1] != "--peers-dir":
        raise SystemExit(f"usage: {Path(__file__).name} {{train,generate,ctranslate2}} "
                         f"--peers-dir DIR [peer flags...] [--dtype float32|bfloat16]")
    mode, peers_dir, rest = argv[0], Path(argv[2]), argv[3:]
    if not (peers_dir / "common.py").exists():
        raise SystemExit(f"--peers-dir {peers_dir}: no common.py there (the peers' scripts, "
                         f"../shared/tools/peers).")
    sys.path.insert(0, str(peers_dir))
    import common

    defaults = {"batch": 32} if mode == "train" else {"batch": 64, "src_len": 20}
    parser = common.parser(__doc__, **defaults)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    return mode, common, parser.parse_args(rest)


def time_train(common, args, torch):
    import torch.nn.functional as F

    cfg = common.model_config(args)
    src_len, tgt_len = args.src_len or args.len, args.tgt_len or args.len
    model = common.build_marian(cfg, seed=0, max_len=max(src_len, tgt_len)).cuda()
    model.config._attn_implementation = args.attn
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    gen = torch.Generator().manual_seed(1)
    pad = common.pad_id(cfg.vocab)
    autocast = args.dtype != "float32"

    def make_batch():
        src = common.random_tokens(gen, args.batch, src_len, cfg.vocab).cuda()
        tgt = common.random_tokens(gen, args.batch, tgt_len, cfg.vocab).cuda()
        dec_in = torch.cat([torch.full_like(tgt[:, :1], pad), tgt[:, :-1]], dim=1)
        return src, dec_in, tgt

    def step(batch):
        src, dec_in, tgt = batch
        torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=getattr(torch, args.dtype), enabled=autocast):
            logits = model(input_ids=src, attention_mask=torch.ones_like(src),
                           decoder_input_ids=dec_in).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt.reshape(-1),
                               label_smoothing=args.label_smoothing)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        return time.perf_counter() - start, loss

    batches = [make_batch() for _ in range(args.warmup + args.steps)]
    times, loss = [], None
    for i, batch in enumerate(batches):
        elapsed, loss = step(batch)
        if i >= args.warmup:
            times.append(elapsed)
    step_s = common.median(times)
    flops = common.train_flops(cfg, args.batch, src_len, tgt_len)
    return [{
        "system": "transformers-MarianMTModel-train", "device": torch.cuda.get_device_name(0),
        "dtype": args.dtype, "autocast": autocast, "optimizer": "torch.optim.Adam(fused=True)",
        "tokens_per_s": round(args.batch * tgt_len / step_s, 1), "step_s": round(step_s, 5),
        "step_s_min": round(min(times), 5), "step_s_max": round(max(times), 5),
        "params": common.count_params(model), "model_gflop_per_step": round(flops / 1e9, 1),
        "model_gflops_per_s": round(flops / step_s / 1e9, 1), "batch": args.batch,
        "src_len": src_len, "tgt_len": tgt_len, "attn": args.attn,
        "peak_mem_bytes": torch.cuda.max_memory_allocated(), "last_loss": round(loss.item(), 3),
        **common.config_fields(args, cfg)}]


def time_generate(common, args, torch):
    cfg = common.model_config(args)
    model = common.build_marian(cfg, seed=0, max_len=max(args.src_len, args.out_len + 1))
    model = model.to("cuda", dtype=getattr(torch, args.dtype)).eval()
    model.config._attn_implementation = args.attn
    gen = torch.Generator().manual_seed(2)
    src = common.random_tokens(gen, args.batch, args.src_len, cfg.vocab).cuda()
    pad = common.pad_id(cfg.vocab)
    lines = []
    for beams in args.beams:
        def run():
            with torch.inference_mode():
                torch.cuda.synchronize()
                start = time.perf_counter()
                out = model.generate(
                    input_ids=src, attention_mask=torch.ones_like(src), num_beams=beams,
                    do_sample=False, min_new_tokens=args.out_len, max_new_tokens=args.out_len,
                    decoder_start_token_id=pad, eos_token_id=common.EOS_ID, pad_token_id=pad,
                    forced_eos_token_id=None, length_penalty=1.0, use_cache=True)
                torch.cuda.synchronize()
                elapsed = time.perf_counter() - start
            assert out.shape == (args.batch, args.out_len + 1), out.shape
            return elapsed

        run()  # warm-up
        batch_s = common.median([run() for _ in range(args.repeats)])
        lines.append({
            "system": "transformers-MarianMTModel-generate",
            "device": torch.cuda.get_device_name(0),
            "dtype": args.dtype, "mode": "greedy" if beams == 1 else f"beam{beams}",
            "sentences_per_s": round(args.batch / batch_s, 2),
            "tokens_per_s": round(args.batch * args.out_len / batch_s, 1),
            "batch_s": round(batch_s, 5), "batch": args.batch, "src_len": args.src_len,
            "out_len": args.out_len, "attn": args.attn, **common.config_fields(args, cfg)})
    return lines


def time_ctranslate2(common, args, torch):
    try:
        import ct2_decode  # the peers' converter (imports ctranslate2 too)
        import ctranslate2
        cuda_devices = ctranslate2.get_cuda_device_count()
    except Exception as error:  # ImportError, or OSError for a missing CUDA library
        return [{"system": "ctranslate2", "unavailable": f"{type(error).__name__}: {error}"}]
    if cuda_devices < 1:
        return [{"system": "ctranslate2", "ctranslate2": ctranslate2.__version__,
                 "unavailable": "ctranslate2.get_cuda_device_count() is 0: this build of "
                                "CTranslate2 finds no usable CUDA device or CUDA libraries"}]
    cfg = common.model_config(args)
    workdir = args.workdir or common.default_workdir(cfg)
    paths, params = ct2_decode.convert(cfg, workdir, args.compute_types,
                                       max_len=max(args.src_len, args.out_len + 1))
    gen = torch.Generator().manual_seed(2)
    ids = common.random_tokens(gen, args.batch, args.src_len, cfg.vocab)
    vocab = ct2_decode.VocabOnlyTokenizer(cfg.vocab)
    source = [[vocab.tokens[i] for i in row] for row in ids.tolist()]
    lines = []
    for compute_type in args.compute_types:
        path, convert_s = paths[compute_type]
        try:
            translator = ctranslate2.Translator(path, device="cuda", compute_type=compute_type)
        except Exception as error:
            lines.append({"system": f"ctranslate2-{compute_type}",
                          "unavailable": f"{type(error).__name__}: {error}"})
            continue
        for beams in args.beams:
            def run():
                start = time.perf_counter()
                result = translator.translate_batch(
                    source, beam_size=beams, max_batch_size=args.batch,
                    min_decoding_length=args.out_len, max_decoding_length=args.out_len,
                    length_penalty=1.0)
                return time.perf_counter() - start, {len(r.hypotheses[0]) for r in result}

            try:
                run()  # warm-up; the first call loads cuBLAS
            except RuntimeError as error:  # e.g. "Library libcublas.so.12 is not found"
                lines.append({"system": f"ctranslate2-{compute_type}",
                              "ctranslate2": ctranslate2.__version__,
                              "unavailable": f"{type(error).__name__}: {error}"})
                break
            runs = [run() for _ in range(args.repeats)]
            batch_s = common.median([elapsed for elapsed, _ in runs])
            lines.append({
                "system": f"ctranslate2-{compute_type}", "device": "cuda",
                "mode": "greedy" if beams == 1 else f"beam{beams}",
                "sentences_per_s": round(args.batch / batch_s, 2),
                "tokens_per_s": round(args.batch * args.out_len / batch_s, 1),
                "batch_s": round(batch_s, 5),
                "output_lengths_seen": sorted(set().union(*(seen for _, seen in runs))),
                "batch": args.batch, "src_len": args.src_len, "out_len": args.out_len,
                "convert_s": round(convert_s, 2), "params": params,
                "ctranslate2": ctranslate2.__version__})
    return lines


def main(argv=None) -> None:
    mode, common, args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    import transformers

    if not torch.cuda.is_available():
        raise SystemExit("peer_gpu.py: torch sees no CUDA device; run the CPU peers instead.")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    timer = {"train": time_train, "generate": time_generate, "ctranslate2": time_ctranslate2}[mode]
    for line in timer(common, args, torch):
        line.update({"torch": torch.__version__, "transformers": transformers.__version__})
        common.emit(line)


if __name__ == "__main__":
    main()
