"""The tenant boundary's remaining gaps, each tried from the attacker's side (issue 25's follow-up):
numbers JSON cannot carry, grammar size, prompt-logprob cost, a client that leaves before the usage
chunk, connection caps per client, and large bodies parsed beside other streams."""

from __future__ import annotations

import json

import pytest

from slaq.api.pool import RequestLimitsSpec
from slaq.sidecar.errors import InvalidField
from slaq.sidecar.fields import BodyLimits
from slaq.sidecar.service import CoreConfig, SidecarCore
from slaq.sidecar.tenants import TenantDirectory
from slaq.sidecar.payload import parse_payload
from tests.sidecar.tables import abc_table, bearer

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
COMPLETION = {"model": "fake-model", "prompt": "hello", "max_tokens": 5}


def limits(**spec) -> BodyLimits:
    return BodyLimits(RequestLimitsSpec(**spec), max_model_len=512)


def _core(**spec) -> SidecarCore:
    return SidecarCore(CoreConfig(limits=limits(**spec)), TenantDirectory.from_table(abc_table()))


# -- 1. numbers JSON cannot carry ------------------------------------------------------------------
SCHEMA_WITH = '{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"number","maximum":%s}}}'


@pytest.mark.parametrize("literal", ["1e309", "-1e309", "1" + "0" * 400 + ".0"], ids=["1e309", "-1e309", "400-digits"])
@pytest.mark.parametrize("where,raw,field", [
    ("nested", '{"prompt":"x","response_format":%s}' % SCHEMA_WITH, "response_format.json_schema.schema.maximum"),
    ("top", '{"prompt":"x","temperature":%s}', "temperature"),
    ("tool", '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"number","minimum":%s}}}}}]}',
     "tools[0].function.parameters.properties.a.minimum"),
], ids=["nested", "top", "tool"])
def test_a_number_out_of_float_range_is_refused_naming_the_field(literal: str, where: str, raw: str, field: str) -> None:
    """1e309 parses to inf, which json.dumps re-sends to the engine as `Infinity` (not JSON)."""
    kind = "chat" if raw.startswith('{"messages"') else "completions"
    core = _core()
    with pytest.raises(InvalidField) as refused:
        flight = core.check_in(core.identify(bearer("std")), kind, (raw % literal).encode())  # type: ignore[arg-type]
        sent = core.enriched_body(flight)
        assert b"Infinity" not in sent and b"NaN" not in sent  # what the engine would have received
    assert refused.value.field == field and "finite" in refused.value.message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_constants_are_refused(literal: str) -> None:
    core = _core()
    with pytest.raises(Exception) as refused:
        core.check_in(core.identify(bearer("std")), "completions", ('{"prompt":"x","response_format":%s}' % (SCHEMA_WITH % literal)).encode())
    assert getattr(refused.value, "reason", None) in ("malformed_json", "invalid_field")


def test_finite_numbers_still_pass() -> None:
    core = _core()
    flight = core.check_in(core.identify(bearer("std")), "completions", ('{"prompt":"x","response_format":%s}' % (SCHEMA_WITH % "1.7e308")).encode())
    assert json.loads(core.enriched_body(flight))["response_format"]["json_schema"]["schema"]["maximum"] == 1.7e308
