"""How many optimizer steps the data makes, and the one line when it makes none.

A run that makes no optimizer step trains nothing, yet would end "completed" with the base
model saved as its result. The recipes batch each process's share of the samples with
``drop_last=True`` (a partial batch is dropped) and step once every
``gradient_accumulation_steps`` batches, so one row with ``batch_size=2``, or accumulation
over more batches than the data has, makes none. The plan checks it before the recipe
starts where the rows are counted exactly and the samples are the rows (not packed); the
recipe process checks it again (``step_guard``) before anything is saved, from the
loader itself.
"""

from __future__ import annotations

from omegaconf import DictConfig

from kubetune.trainer.request.spelling import spelling


def batches_per_process(samples: int, batch_size: int, world_size: int) -> int:
    """A ``DistributedSampler`` (no drop_last) hands each process ceil(samples / world)."""
    per_process = -(-samples // max(1, world_size))
    return per_process // max(1, batch_size)


def no_step_line(samples: int, batch_size: int, accumulation: int, world_size: int,
                 what: str = "row(s)", spellings: dict[str, str] | None = None) -> str:
    """The line; the two settings named as the user set them (``spellings``: --batch-size,
    KUBETUNE_GRADIENT_ACCUMULATION_STEPS), else by their keys."""
    batches = batches_per_process(samples, batch_size, world_size)
    size = spelling(spellings or {}, "batch_size")
    steps = spelling(spellings or {}, "gradient_accumulation_steps")
    if samples == 0:
        return ("the run makes no optimizer step: no sample is left to train on (every row "
                "longer than tokenizer.max_seq_len, or filtered out): check the dataset")
    return (f"the run makes no optimizer step: {samples} {what} over {world_size} process(es) "
            f"make {batches} batch(es) of {size.assign(str(batch_size))} per process (a "
            f"partial batch is dropped), and one step takes "
            f"{steps.assign(str(accumulation))} batch(es): lower {size.name} or {steps.name}, "
            "or add rows")


def check_makes_a_step(cfg: DictConfig, rows: int | None, rows_exact: bool,
                       world_size: int, spellings: dict[str, str] | None = None) -> str | None:
    """The line when ``rows`` rows cannot make one optimizer step, else None. Only where
    the count is certain: exact, unpacked (packs are counted in the recipe), and the whole
    of one dataset (no split slice such as ``train[:10%]``)."""
    dataset = cfg.get("dataset")
    if rows is None or not rows_exact or not isinstance(dataset, DictConfig) \
            or dataset.get("packed") or "[" in str(dataset.get("split") or ""):
        return None
    batch_size = int(cfg.get("batch_size") or 1)
    accumulation = int(cfg.get("gradient_accumulation_steps") or 1)
    if batches_per_process(rows, batch_size, world_size) // accumulation > 0:
        return None
    return no_step_line(rows, batch_size, accumulation, world_size, spellings=spellings)
