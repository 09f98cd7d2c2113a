"""Which weight files a model download keeps: safetensors, else the pickle-based formats."""

from __future__ import annotations

from kubetune.initializers.sources.base import RemoteFile

SAFE_SUFFIXES = (".safetensors",)
# Formats that need pickle (or another framework) to load. kubetune never loads them; the
# trainer would, which is why they are only fetched when nothing safer exists.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
OTHER_FRAMEWORK_SUFFIXES = (".h5", ".msgpack", ".onnx", ".tflite", ".ot")
WEIGHT_SUFFIXES = SAFE_SUFFIXES + PICKLE_SUFFIXES + OTHER_FRAMEWORK_SUFFIXES


def _suffix(path: str) -> str:
    name = path.rsplit("/", 1)[-1].lower()
    return "." + name.rsplit(".", 1)[-1] if "." in name else ""


def choose(files: list[RemoteFile]) -> tuple[list[RemoteFile], str | None]:
    """The files to fetch for a model, and a note for the log (None if nothing was dropped)."""
    has_safetensors = any(_suffix(f.path) in SAFE_SUFFIXES for f in files)
    if has_safetensors:
        dropped = [f for f in files if _suffix(f.path) in PICKLE_SUFFIXES + OTHER_FRAMEWORK_SUFFIXES]
        if not dropped:
            return files, None
        kept = [f for f in files if f not in dropped]
        names = ", ".join(sorted({_suffix(f.path) for f in dropped}))
        return kept, (f"the source has safetensors weights: skipping {len(dropped)} "
                      f"{names} file(s)")
    pickled = [f for f in files if _suffix(f.path) in PICKLE_SUFFIXES]
    if pickled:
        return files, (f"the source has no safetensors weights: fetching {len(pickled)} "
                       f"pickle-based file(s) ({', '.join(sorted({_suffix(f.path) for f in pickled}))}); "
                       "kubetune does not load them, the trainer will")
    return files, None


def has_weights(paths: list[str]) -> bool:
    return any(_suffix(p) in SAFE_SUFFIXES + PICKLE_SUFFIXES for p in paths)
