"""Time to prepare the real GSM8K train set (7,473 rows) the way the course does.

Load the JSONL files through ``datasets`` (the hub's code path), parse answers,
validate, build conversational prompts, count tokens with the bundled
tokenizer, filter to the prompt budget, split (eval from the test split) and
save with a card. Prints ONE JSON object to stdout; progress goes to stderr.

    python bench/data_prep.py [--data DIR]     # or COURSE_GSM8K_DIR=DIR

Without the files it prints ``{"available": false, ...}`` and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "data" / "gsm8k"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("COURSE_GSM8K_DIR") or str(DEFAULT),
                        help="folder with train.jsonl and test.jsonl (default: %(default)s)")
    parser.add_argument("--profile", default="colab-t4", help="sizes come from this profile")
    args = parser.parse_args(argv)
    data = Path(args.data)
    if not ((data / "train.jsonl").is_file() and (data / "test.jsonl").is_file()):
        print(json.dumps({"benchmark": "data_prep", "available": False,
                          "reason": f"no train.jsonl/test.jsonl in {data}; pass --data or set "
                                    "COURSE_GSM8K_DIR"}))
        return 0

    from helpers import data as D
    from helpers.models import load_tokenizer
    from helpers.profiles import get_profile
    from helpers.tasks import get_task
    from helpers.tasks.arithmetic import load_gsm8k

    profile = get_profile(args.profile)
    t = time.perf_counter()
    tok = load_tokenizer(get_profile("cpu-smoke"))  # the bundled tokenizer, with the course's prefill
    tokenizer_s = time.perf_counter() - t
    log(f"tokenizer loaded in {tokenizer_s:.1f}s")

    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    t = t0
    gsm8k = load_gsm8k(data)
    stages["load"] = time.perf_counter() - t
    log(f"loaded {gsm8k['train'].num_rows} + {gsm8k['test'].num_rows} rows")
    t = time.perf_counter()
    splits, card = D.prepare_dataset(
        gsm8k["train"], tok, get_task("arithmetic"), train_rows=profile.train_rows, eval_rows=profile.eval_rows,
        max_prompt_tokens=profile.max_prompt_tokens, seed=profile.split_seed, eval_source=gsm8k["test"],
        source={"task": "gsm8k", "from": str(data)})
    stages["answers_validate_prompt_tokenise_filter_split"] = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        D.save_prepared(splits, Path(tmp) / "dataset", card)
        stages["save"] = time.perf_counter() - t
        t = time.perf_counter()
        back = D.load_prepared(Path(tmp) / "dataset")
        load_back_s = time.perf_counter() - t
    total = time.perf_counter() - t0
    rows_in = card["counts"]["rows"]["loaded"]
    log(f"prepared in {total:.1f}s")
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped({
        "benchmark": "data_prep",
        "available": True,
        "data": str(data),
        "tokenizer": "smollm2-135m (bundled)",
        "profile_sizes": args.profile,
        "train_rows_in": rows_in,
        "test_rows_in": card["counts"]["eval_source"]["loaded"],
        "train_rows_out": back["train"].num_rows,
        "eval_rows_out": back["eval"].num_rows,
        "removed": {k: v for k, v in card["counts"]["rows"].items() if k.endswith("_removed")},
        "token_lengths": card["token_lengths"],
        "seconds": {k: round(v, 3) for k, v in stages.items()},
        "total_seconds": round(total, 3),
        "rows_per_second": round(rows_in / total, 1),
        "tokenizer_load_seconds": round(tokenizer_s, 3),
        "load_prepared_seconds": round(load_back_s, 3),
        "cpus": os.cpu_count(),
    })))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
