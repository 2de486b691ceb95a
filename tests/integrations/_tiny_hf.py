"""A transformers Trainer small enough for a test: a one-layer GPT-2 built from a
config, 32 synthetic token sequences, CPU; nothing is downloaded."""

from __future__ import annotations

from typing import Any

import torch
import transformers as hf


def tiny_trainer(tmp_path: Any, steps: int = 4, evaluate_every: int | None = None, cls: Any = None,
                 **arguments: Any) -> Any:
    """``arguments``: more TrainingArguments (gradient_accumulation_steps=4, logging_steps=1, ...)."""
    torch.manual_seed(0)
    config = hf.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                           bos_token_id=0, eos_token_id=0)
    model = hf.GPT2LMHeadModel(config)

    class Tokens(torch.utils.data.Dataset):  # synthetic: nothing is downloaded
        def __len__(self) -> int:
            return 32

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    args = hf.TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=4, per_device_eval_batch_size=16,
        report_to=[], use_cpu=True, disable_tqdm=True,
        **{"save_strategy": "no", "logging_strategy": "no", "eval_strategy": "steps" if evaluate_every else "no", "eval_steps": evaluate_every, "learning_rate": 1e-2,
           **arguments})
    return (cls or hf.Trainer)(model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens())
