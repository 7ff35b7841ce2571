"""The compression gate's verdicts on a model, as a worker records them at its first start, kept as a result file.

Measures each compression with `measure_compression` (the serving default's mode and ratio, the canary's
calibration prompts, the gate's default bounds) on the model in the serving dtype of this machine, fusing with
the engine the worker serves with (`--engine vllm`, its kernels: what a served worker records) or blendserve's
torch runner (`--engine torch`). The two compute the fused prompts with different kernels, and their verdicts
differ by more than the bound's width.

    .venv/bin/python bench/compression_verdicts.py --out docs/results/compression/verdicts_xeon_amx.json
"""
import argparse
import json
import tempfile
from pathlib import Path

from workers.fuser import Fuser
from workers.guardrails.compression_gate import DEFAULT_MAX_KL_INCREASE, measure_compression
from workers.model.checkpoint import load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, measured_on, resolve_dtype, torch_dtype
from workers.model.runner import ModelRunner
from workers.vllm.engine import VLLMEngine


def main() -> None:
    """Parse arguments, measure every compression, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the default model)")
    parser.add_argument("--dtype", default=AUTO, help="model dtype (auto: the serving dtype on this CPU)")
    parser.add_argument("--compressions", default=",".join(DEFAULT_MAX_KL_INCREASE))
    parser.add_argument("--engine", choices=("vllm", "torch"), default="vllm")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model = args.model or prepare_default_model()
    dtype = resolve_dtype(args.dtype, model, on_gpu=False)
    names = [name.strip() for name in args.compressions.split(",") if name.strip()]

    def measure(fuser: Fuser) -> dict[str, dict]:
        return {name: measure_compression(fuser, name, DEFAULT_MAX_KL_INCREASE[name]).as_record() for name in names}

    if args.engine == "torch":
        fuser = Fuser(ModelRunner(load_checkpoint(model, torch_dtype(dtype))))
        verdicts = measure(fuser)
    else:
        engine = VLLMEngine.start(model, Path(tempfile.mkdtemp(prefix="bs-verdicts-")), dtype=dtype)
        try:
            fuser = engine.fuser
            verdicts = engine.call(lambda: measure(fuser))  # on the engine's thread, as at worker start
        finally:
            engine.close()
    result = {"model": model.name, **measured_on(dtype), "engine": args.engine,
              "recompute_ratio": fuser.options.recompute_ratio, "verdicts": verdicts}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
