"""GET /spec against the server it describes: real answers fit the schemas it gives them, and
every route the application takes is in it. In-process (Starlette's test client), with the
stand-in models of test_serving_libretranslate."""

from __future__ import annotations

from types import SimpleNamespace

from test_serving_libretranslate import FRENCH, GERMAN, fake_client

from nmt.models.translations import Hypothesis

_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float)}


def fits(value, schema: dict, where: str = "answer") -> list[str]:
    """Where `value` does not fit `schema` (the OpenAPI subset /spec writes: type, properties,
    required, items, enum, oneOf, anyOf)."""
    if "oneOf" in schema or "anyOf" in schema:
        choices = schema.get("oneOf") or schema["anyOf"]
        fitting = sum(not fits(value, choice, where) for choice in choices)
        if fitting == 1 or (fitting > 1 and "anyOf" in schema):
            return []
        return [f"{where}: {value!r} fits {fitting} of {choices}"]
    kind = schema.get("type")
    if kind and (not isinstance(value, _TYPES[kind]) or isinstance(value, bool)):
        return [f"{where}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} not in {schema['enum']}"]
    faults = [f"{where}: no {name}" for name in schema.get("required", ())
              if name not in value]
    for name, inner in schema.get("properties", {}).items():
        if isinstance(value, dict) and name in value:
            faults += fits(value[name], inner, f"{where}.{name}")
    if kind == "array":
        for n, item in enumerate(value):
            faults += fits(item, schema.get("items", {}), f"{where}[{n}]")
    return faults


def untyped_arrays(schema, where: str = "schema") -> list[str]:
    """The array schemas in `schema` that say nothing of their items."""
    if isinstance(schema, list):
        return [f for n, inner in enumerate(schema) for f in untyped_arrays(inner, f"{where}[{n}]")]
    if not isinstance(schema, dict):
        return []
    found = [where] if schema.get("type") == "array" and "items" not in schema else []
    return found + [f for name, inner in schema.items()
                    for f in untyped_arrays(inner, f"{where}.{name}")]


def answer_schema(client, path: str, method: str, status: int) -> dict:
    spec = client.get("/spec").json()
    content = spec["paths"][path][method]["responses"][str(status)]["content"]
    return content["application/json"]["schema"]


def with_alternatives(client) -> None:
    """Each model gives three distinct translations of each sentence, for alternatives."""
    for model in client.app.state.service.catalog.models:
        async def search(batch, pair=model.pair):
            return [[Hypothesis(f"{pair} {rank}: {sentence}", -rank, ()) for rank in range(3)]
                    for sentence in batch]
        model.alternatives_batcher = SimpleNamespace(translate=search)


def test_translate_answers_fit_the_spec_for_a_text_and_a_list():
    """A list q with source auto answers a list of detectedLanguage objects and a list of
    lists of alternatives; a single text, one object and one list: both fit /spec."""
    client, _ = fake_client("de:en", "fr:en")
    with_alternatives(client)
    schema = answer_schema(client, "/translate", "post", 200)
    for q in ([GERMAN, FRENCH], GERMAN):
        answer = client.post("/translate", json={"q": q, "source": "auto", "target": "en",
                                                 "alternatives": 2})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert isinstance(body["detectedLanguage"], list) == isinstance(q, list)
        assert len(body["alternatives"]) == 2
        assert fits(body, schema) == [], body
    assert untyped_arrays(schema) == []
