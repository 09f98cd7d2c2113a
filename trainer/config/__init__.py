"""One merged torchtune config, checked before launch: torchtune's recipe and base config
by name plus ``key=value`` overrides (``recipe_config``), typos in override keys
(``config_keys``, reading a component's parameters with ``component_params``; a user's
``_component_`` module imported in a child before launch by ``component_import``), value
checks that need no torch (``validate``), a LoRA rank set alone keeping the config's
alpha/rank ratio (``lora_scale``), the dataset settings a builder takes (``builder_settings``), and ``saved_config``: the merged config as saved where
others read it (no URL credentials). The merge itself is ``planning.plan``'s: it asks the
rooms above this one (data reads ``component_params``), so it sits above them."""
