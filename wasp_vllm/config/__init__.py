"""A run's settings: one value per role (``roles``), composed into :class:`RunConfig` (``run``), and
the machinery every settings model shares (``fields``: a field with its help and panel, errors)."""

from wasp_vllm.config.fields import (
    ConfigError,
    Role,
    build_settings,
    read_config_file,
    setting,
)
from wasp_vllm.config.roles import (
    DataSettings,
    EngineArgs,
    EngineKind,
    EngineSettings,
    MethodSettings,
    PrivacySettings,
    SamplingSettings,
    WhatSettings,
)
from wasp_vllm.config.run import VOLATILE, RunConfig, build_config

__all__ = [
    "VOLATILE",
    "ConfigError",
    "DataSettings",
    "EngineArgs",
    "EngineKind",
    "EngineSettings",
    "MethodSettings",
    "PrivacySettings",
    "Role",
    "RunConfig",
    "SamplingSettings",
    "WhatSettings",
    "build_config",
    "build_settings",
    "read_config_file",
    "setting",
]
