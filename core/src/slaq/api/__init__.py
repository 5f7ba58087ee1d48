"""slaq's API types: the CRDs, the tenant table and the request-enrichment contract.

The operator, the sidecar and the engine import these (never each other's internals).
"""

from slaq.api.common import API_VERSION, GROUP, TIER_RANK, VERSION, Condition, LabelSelector, Tier, duration_seconds
from slaq.api.contract import CLIENT_FIELDS_STRIPPED, XARG_KEYS, RequestSLA, enrich_body
from slaq.api.pool import InferencePool, InferencePoolSpec, InferencePoolStatus
from slaq.api.table import EngineTable, EngineTenant, ReplicaShare, TenantEntry, TenantTable, derive_cache_salt, hash_api_key
from slaq.api.tenant import TenantSLA, TenantSLASpec, TenantSLAStatus

__all__ = [
    "API_VERSION", "GROUP", "VERSION", "TIER_RANK", "Tier", "Condition", "LabelSelector", "duration_seconds",
    "CLIENT_FIELDS_STRIPPED", "XARG_KEYS", "RequestSLA", "enrich_body",
    "InferencePool", "InferencePoolSpec", "InferencePoolStatus",
    "EngineTable", "EngineTenant", "ReplicaShare", "TenantEntry", "TenantTable", "derive_cache_salt", "hash_api_key",
    "TenantSLA", "TenantSLASpec", "TenantSLAStatus",
]
