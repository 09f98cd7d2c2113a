"""One merged torchtune config, checked before launch: torchtune's recipe and base config
by name plus ``key=value`` overrides (``recipe_config``), typos in override keys
(``config_keys``, reading a component's parameters with ``component_params``), value
checks that need no torch (``validate``), a LoRA rank set alone keeping the config's
alpha/rank ratio (``lora_scale``), a config's settings for its own model fitted to the
checkpoint (``model_shaped``), and ``plan``, which merges the request with what
the checkpoint, the hardware, the data and an earlier run say into the config that runs;
``saved_config``: that config as saved where others read it (no URL credentials)."""
