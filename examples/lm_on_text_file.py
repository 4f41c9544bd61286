"""The byte-level GPT language model, federated over sites, on a text file of yours.

Each site holds a contiguous share of the file's training windows; accuracy is next-byte
accuracy on held-out windows and the loss is the validation cross-entropy (perplexity is its
exponential). The default model is the ``tiny`` size (about 1 M parameters, CPU-sized); on a GPU
pick ``--size small`` or larger. Without ``--text`` the embedded synthetic corpus is used.

    python examples/lm_on_text_file.py --text input.txt          # a few minutes on two cores
    python examples/lm_on_text_file.py --text input.txt --size small --device cuda
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import powertrip as pt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", type=Path, help="a UTF-8 (or any byte) text file")
    ap.add_argument("--size", default="tiny", help="tiny, small, medium, large or xl")
    ap.add_argument("--layers", type=int, help="override the size's layer count")
    ap.add_argument("--d-model", type=int, help="override the size's width")
    ap.add_argument("--context", type=int, help="override the size's context length (bytes)")
    ap.add_argument("--windows", type=int, default=4000, help="training windows to keep")
    ap.add_argument("--sites", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--target", type=float, default=0.3, help="next-byte accuracy to reach")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    config = pt.build_config(
        workload="lm",
        dataset_path=args.text,
        model_size=args.size,
        n_layer=args.layers,
        d_model=args.d_model,
        context_length=args.context,
        num_samples=args.windows,
        partition="iid",
        num_sites=args.sites,
        policies=("powertrip", "select-all"),
        static_sweep=(),
        target_accuracy=args.target,
        max_rounds=args.rounds,
    )
    result = pt.run_study(config, device=args.device)
    for _, run in result.runs:
        last = run.rounds[-1]
        reached = run.time_to(args.target)
        when = "not reached" if reached is None else f"{reached / 3600:.2f} h"
        print(
            f"{run.policy:12s} next-byte accuracy {last.accuracy:.3f}  validation loss "
            f"{last.loss:.3f} (perplexity {math.exp(last.loss):.1f})  "
            f"time to {args.target:.0%}: {when}"
        )


if __name__ == "__main__":
    main()
