"""Mirror-BERT through sentence-transformers' own trainer: a text file of strings in, a saved model out.

    python examples/sentence_transformers_trainer.py MODEL DATA OUTPUT [--epochs 1] [--batch-size 200]

MODEL: a masked LM or sentence-transformers folder (or hub id); DATA: one string per line; OUTPUT: the folder
the trained model is saved to (loads in sentence-transformers, transformers and mirrorbert). The settings are the
paper's sentence preset, as `mirrorbert train --preset sentence` runs it: temperature 0.04, a 5-character span
masked in the second view, a constant lr of 2e-5 without warmup (use --lr 5e-4 for a small MLM such as the
quickstart's 11M-parameter reference model), mean pooling, strings truncated at 50 tokens.

A masked LM is turned into a sentence-transformers model by mirrorbert's own loader (`Encoder.load(...).write`):
the MLM head is left out and no pooler is added, so nothing is reported missing or unexpected, and any
architecture mirrorbert loads works.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("output")
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)

    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from mirrorbert import Encoder
    from mirrorbert.integrations.sentence_transformers import MirrorBertDataCollator, MirrorBertLoss
    from mirrorbert.safeguards.writes import WritePlan, atomic_output_dir

    # mirrorbert's write policy: OUTPUT must not exist (or be inside MODEL/DATA); written aside, then renamed
    plan = WritePlan({"MODEL": args.model, "DATA": args.data}).folder("OUTPUT", args.output)
    with plan.locked(), tempfile.TemporaryDirectory() as trainer_dir:
        strings = list(dict.fromkeys(s.strip() for s in Path(args.data).read_text(encoding="utf-8").splitlines()
                                     if s.strip()))
        if (Path(args.model) / "modules.json").exists():  # already a sentence-transformers model
            model = SentenceTransformer(args.model)
        else:  # a masked LM: the encoder (no MLM head, no pooler) plus mean pooling, max length 50
            folder = Path(trainer_dir) / "base"
            Encoder.load(args.model, pooling="mean", max_length=50).write(folder)
            model = SentenceTransformer(str(folder))
        trainer = SentenceTransformerTrainer(
            model=model,
            train_dataset=Dataset.from_dict({"text": strings}),
            loss=MirrorBertLoss(model, temperature=0.04),
            data_collator=MirrorBertDataCollator(model, mask_span=5, seed=args.seed),
            args=SentenceTransformerTrainingArguments(
                output_dir=trainer_dir, num_train_epochs=args.epochs, max_steps=args.max_steps,
                per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
                lr_scheduler_type="constant", warmup_steps=0,  # as mirrorbert train (the paper): no decay
                dataloader_pin_memory=torch.cuda.is_available(),  # pinning means nothing without a GPU
                seed=args.seed, report_to=[], save_strategy="no", logging_steps=1,
            ),
        )
        trainer.train()
        with atomic_output_dir(args.output, kind="model") as tmp:
            model.save_pretrained(str(tmp))
    print(f"model saved to {args.output}")
    return 0


if __name__ == "__main__":
    from mirrorbert.errors import UserError

    try:
        raise SystemExit(main())
    except UserError as exc:  # one line, as the mirrorbert commands answer
        raise SystemExit(f"sentence_transformers_trainer.py: error: {exc}") from None
