"""Moved to kubetune/tools/uv_settings.py (``make demo-real`` installs with it too)."""

from kubetune.tools.uv_settings import pip_settings, uv_environment

__all__ = ["pip_settings", "uv_environment"]
