"""The run's settings: the manifest (``[run]``, ``[target]``, ``[backends.*]``, ``[[datasets]]``,
``[model]``, ``Sampling``) and the table of backend kinds. Plain pydantic models and tables of
data: config imports records, errors and files, never a stage."""

from .backends import (
    BACKENDS,
    BackendCfg,
    BackendKind,
    EngineBackendCfg,
    HFBackendCfg,
    OpenAIBackendCfg,
    redact_url,
    url_problem,
)
from .manifest import (
    EVAL_SET_NAMES,
    QUALITY_CHECK_NAMES,
    READER_NAMES,
    DatasetCfg,
    Manifest,
    ManifestError,
    ModelCfg,
    RunCfg,
    Sampling,
    TargetCfg,
    load_manifest,
)

__all__ = [
    "BACKENDS",
    "EVAL_SET_NAMES",
    "QUALITY_CHECK_NAMES",
    "READER_NAMES",
    "BackendCfg",
    "BackendKind",
    "DatasetCfg",
    "EngineBackendCfg",
    "HFBackendCfg",
    "Manifest",
    "ManifestError",
    "ModelCfg",
    "OpenAIBackendCfg",
    "RunCfg",
    "Sampling",
    "TargetCfg",
    "load_manifest",
    "redact_url",
    "url_problem",
]
