"""Run in a Python with transformers (never imported by kubetune): each causal-LM
``model_type`` transformers registers, its default config as config.json writes it (a
multimodal config's text part where that is what its causal LM reads). Prints one JSON
object {model_type: config dict, or {"_error": why it could not be made}}.
Usage: python configs.py"""

import json

from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def main() -> None:
    out = {}
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = AutoConfig.for_model(model_type)
            made = config.to_dict()
        except Exception as exc:  # one type's broken default must not hide the others
            made = {"_error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        made["model_type"] = made.get("model_type") or model_type
        out[model_type] = made
    import transformers

    out["_transformers_version"] = transformers.__version__
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
