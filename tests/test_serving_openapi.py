"""GET /spec against the server it describes: real answers fit the schemas it gives them, and
every route the application takes is in it. In-process (Starlette's test client), with the
stand-in models of test_serving_libretranslate."""

from __future__ import annotations

from types import SimpleNamespace

from test_serving_libretranslate import FRENCH, GERMAN, fake_client

from nmt.models.translations import Hypothesis

_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
          "boolean": bool}


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
    if kind and (not isinstance(value, _TYPES[kind])
                 or isinstance(value, bool) != (kind == "boolean")):
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


def test_every_route_of_the_application_is_in_the_spec():
    """The spec's paths and methods are the application's routes, each with the statuses it
    can answer: a GET that reads no key or body lists no 403, 415 or 429."""
    from nmt.serving.app import ROUTES

    client, _ = fake_client("de:en")
    spec = client.get("/spec").json()["paths"]
    routes = {(route.path, method.lower()) for route in ROUTES
              for method in route.methods if method != "HEAD"}
    assert {(path, method) for path, item in spec.items() for method in item} == routes
    for path, method in routes:
        statuses = set(spec[path][method]["responses"])
        if method == "get":
            assert not statuses & {"403", "415", "429"}, (path, statuses)
        else:
            assert {"408", "413", "500"} <= statuses, (path, statuses)
    assert "404" in spec["/download_file/{name}"]["get"]["responses"]


def test_answers_and_requests_fit_the_spec_route_by_route():
    """/detect takes a list q; /translate takes its fields in the query string alone; a
    download comes as the media type listed; OpenNMT-py's src is required and its answer typed."""
    client, _ = fake_client("de:en")
    spec = client.get("/spec").json()["paths"]
    detect = spec["/detect"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert fits([GERMAN, GERMAN], detect["properties"]["q"]) == []
    answer = client.post("/detect", json={"q": [GERMAN, GERMAN]})
    assert fits(answer.json(), answer_schema(client, "/detect", "post", 200)) == []

    translate = spec["/translate"]["post"]
    assert translate["requestBody"]["required"] is False
    assert {p["name"] for p in translate["parameters"] if p["in"] == "query"} >= {
        "q", "source", "target", "api_key"}
    answer = client.post("/translate?q=Hund&q=Katze&source=de&target=en")
    assert answer.json() == {"translatedText": ["de-en: Hund", "de-en: Katze"]}

    url = client.post("/translate_file", data={"source": "de", "target": "en"}, files={
        "file": ("a.txt", b"Hund\n", "text/plain")}).json()["translatedFileUrl"]
    download = spec["/download_file/{name}"]["get"]["responses"]
    assert client.get(url).headers["content-type"] in download["200"]["content"]
    gone = client.get("/download_file/nothing.txt")
    assert gone.status_code == 404 and "application/json" in download["404"]["content"]

    opennmt = spec["/translator/translate"]["post"]
    item = opennmt["requestBody"]["content"]["application/json"]["schema"]["items"]
    assert item["required"] == ["src"]
    answer = client.post("/translator/translate", json=[{"src": "Hund"}])
    assert fits(answer.json(), answer_schema(client, "/translator/translate", "post", 200)) == []
    for path in ("/translator/models", "/frontend/settings", "/languages"):
        assert fits(client.get(path).json(), answer_schema(client, path, "get", 200)) == []
    for path in ("/health", "/translator/health"):
        assert fits(client.get(path).json(), answer_schema(client, path, "get", 200)) == []
    assert untyped_arrays(spec) == []


def test_the_key_refusal_says_how_to_send_a_key_on_opennmt_routes_too():
    """OpenNMT-py's body is a list, with no field for api_key: the refusal names the ways
    that work there, which do, as /spec says."""
    client, _ = fake_client("de:en")
    client.app.state.service.api_keys = frozenset({"KEY1"})
    refused = client.post("/translator/translate", json=[{"src": "Hund"}])
    message = refused.json()["error"]
    assert refused.status_code == 403
    assert "?api_key=KEY" in message and "Authorization: Bearer KEY" in message
    for query, headers in (("?api_key=KEY1", {}), ("", {"Authorization": "Bearer KEY1"})):
        answer = client.post(f"/translator/translate{query}", json=[{"src": "Hund"}],
                             headers=headers)
        assert answer.status_code == 200, answer.text
    parameters = client.get("/spec").json()["paths"]["/translator/translate"]["post"][
        "parameters"]
    assert "Authorization: Bearer KEY" in parameters[0]["description"]
