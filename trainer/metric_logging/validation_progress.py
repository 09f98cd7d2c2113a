"""The held-out losses as the progress line tells them: each evaluation read against the
base model (step 0) and the best so far, ``validation: step N | val_loss x | base y | best z
@ step s``, then an objective's own numbers (a DPO run's ``reward acc``, ``margin`` ...).

Fed the ``val_loss`` records the metric logger writes to ``metrics.jsonl``; a resumed run
seeds it with the records already there, so its line still names the base and the best.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from kubetune.workspace import held_out_keys


class ValidationProgress:
    def __init__(self) -> None:
        self._losses: dict[int, float] = {}  # step -> val_loss (the last measurement wins)

    def seed(self, records: Iterable[Mapping[str, Any]]) -> None:
        for record in records:
            if "val_loss" in record and "step" in record:
                self._losses[int(record["step"])] = float(record["val_loss"])

    def add(self, record: Mapping[str, Any]) -> None:
        self._losses[int(record["step"])] = float(record["val_loss"])

    @property
    def base(self) -> float | None:
        return self._losses.get(0)

    def best(self, up_to: int) -> tuple[int, float] | None:
        """(step, val_loss) of the lowest loss at or before ``up_to``: a resumed run's
        earlier records may reach past the step it resumed from."""
        seen = [(loss, step) for step, loss in self._losses.items() if step <= up_to]
        if not seen:
            return None
        loss, step = min(seen)
        return step, loss

    def fields(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The numbers of one evaluation, with the base and the best so far."""
        step = int(record["step"])
        best = self.best(step)
        own = {n.key: float(record[n.key]) for n in held_out_keys.present(dict(record))}
        return {"step": step, "val_loss": float(record["val_loss"]),
                "val_tokens": record.get("val_tokens"), "base_val_loss": self.base,
                "best_val_loss": best[1] if best else None,
                "best_step": best[0] if best else None, **own}

    def text(self, record: Mapping[str, Any]) -> str:
        f = self.fields(record)
        parts = [f"step {f['step']}", f"val_loss {f['val_loss']:.4f}"]
        if f["base_val_loss"] is not None:
            parts.append(f"base {f['base_val_loss']:.4f}")
        if f["best_val_loss"] is not None:
            parts.append(f"best {f['best_val_loss']:.4f} @ step {f['best_step']}")
        parts += [held_out_keys.shown(n, f[n.key]) for n in held_out_keys.present(f)]
        return "validation: " + " | ".join(parts)

    def status_metrics(self, record: Mapping[str, Any]) -> dict[str, object]:
        """For the TrainJob status: the latest held-out loss beside the training loss."""
        f = self.fields(record)
        metrics: dict[str, object] = {"val_loss": f"{f['val_loss']:.6g}"}
        if f["best_val_loss"] is not None:
            metrics["best_val_loss"] = f"{f['best_val_loss']:.6g}"
        if f["base_val_loss"] is not None:
            metrics["base_val_loss"] = f"{f['base_val_loss']:.6g}"
        for number in held_out_keys.present(f):
            metrics[number.key] = f"{f[number.key]:.6g}"
        return metrics
