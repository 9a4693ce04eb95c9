"""LibreTranslate's file translation: POST /translate_file, then GET /download_file/NAME.

    POST /translate_file  multipart: file=@report.docx, source=en, target=de[, api_key=...]
    -> {"translatedFileUrl": "http://HOST/download_file/<id>.report.docx"}

The file (.txt, .html or .docx: `nmt.translation.document_files`) is cut into sentences,
searched with the model's batcher as /translate's texts are, and rebuilt with its layout and
formatting; the translation is kept in memory for a while (`nmt.serving.file_store`) under
a random name, which is what the download URL holds.
"""

from __future__ import annotations

import asyncio
import itertools

from starlette.datastructures import UploadFile
from starlette.formparsers import parse_options_header
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nmt.serving.detection import has_letters
from nmt.serving.errors import RequestError, shown
from nmt.serving.file_store import KEEP_SECONDS, content_disposition
from nmt.serving.libretranslate import join_documents, translate_sentences
from nmt.serving.params import api_key, content_type, read_multipart
from nmt.serving.service import Service, unless_client_leaves
from nmt.translation import document_files

_FIELDS = 8  # form fields besides the file: source, target, api_key and a few a client adds


async def _upload(request: Request) -> tuple[UploadFile, dict[str, str]]:
    """The uploaded file and the text fields of a multipart form."""
    kind = content_type(request)
    if kind != "multipart/form-data":
        raise RequestError(415, f"a request body of type {shown(kind or 'none')} is not read "
                                "here; send the file as multipart/form-data (curl -F "
                                "file=@report.docx -F source=en -F target=de)")
    fields: dict[str, str] = {}
    upload = None
    body = await request.body()  # read whole already (BodyReader): is it all there?
    form = await read_multipart(request, max_fields=_FIELDS, max_files=1)
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            upload = value if key == "file" else upload
        else:
            fields[key] = value
    _, options = parse_options_header(request.headers["content-type"])
    if b"--" + options.get(b"boundary", b"") + b"--" not in body:
        await form.close()
        raise RequestError(400, "malformed multipart form: the body ends before its closing "
                                "boundary, cut short; send the whole form")
    if upload is None and "file" in fields:
        raise RequestError(400, "Invalid request: the file parameter came without a filename, "
                                "as a text field; name it with filename=\"report.docx\" in its "
                                "Content-Disposition (filename* alone is not read in a form, "
                                "RFC 7578), as curl -F file=@report.docx does")
    if upload is None:
        raise RequestError(400, "Invalid request: missing file parameter")
    return upload, fields


async def translate_file(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    upload, fields = await _upload(request)
    service.check_key(fields.get("api_key") or api_key(request))
    source, target = fields.get("source"), fields.get("target")
    for name, value in (("source", source), ("target", target)):
        if not value:
            raise RequestError(400, f"Invalid request: missing {name} parameter")
    data, filename = await upload.read(), upload.filename or ""
    await upload.close()
    service.charge(request, 1, 0)  # a client past its limits is refused before the file is read
    prepared = await _prepare_within_limit(request, service, data, filename, source)
    service.charge(request, 1, prepared.characters)
    # The language is told by the first sentences with letters (those without are no
    # language, and a file of none comes back as it is).
    sample = list(itertools.islice((s for document in prepared.documents
                                    for s in document.sentences if has_letters(s)), 50))
    model, _ = service.source_model(source, target, sample)
    rebuilt = data  # no model: the file is in the language asked for already, or has no letters
    if model is not None:
        if model.source != _cutting_language(source):
            prepared = await _prepare(data, filename, model.source)
        translated = await unless_client_leaves(
            request, _translate_in_parts(service, model, prepared.documents))
        rebuilt = await asyncio.to_thread(prepared.rebuild, translated)
    name = service.files.put(rebuilt, filename, document_files.media_type(filename))
    return JSONResponse({"translatedFileUrl": str(request.url_for("download_file",
                                                                  name=name))})


def _cutting_language(source: str) -> str:
    """The language whose rules cut a file's sentences: the source, English ones until
    "auto" is told (the file is cut again if it tells another)."""
    return source if source != "auto" else "en"


async def _prepare_within_limit(request: Request, service: Service, data: bytes,
                                filename: str, source: str):
    """The file cut into documents, read no further than --file-char-limit: a file past it,
    or holding more markup than it allows, is refused 413 and counts as one request of no
    characters, since it was read that far."""
    limit = service.limits.max_file_characters
    try:
        return await _prepare(data, filename, _cutting_language(source), limit)
    except document_files.TooMuchMarkup as err:
        service.keep_charge(request)
        raise RequestError(413, f"the file holds more markup than this server reads for its "
                                f"limit of {limit} characters (--file-char-limit): {err}"
                           ) from None
    except document_files.TooManyCharacters:
        service.keep_charge(request)
        raise RequestError(413, f"the file has more characters to translate than this "
                                f"server's limit of {limit} (--file-char-limit)") from None


async def _prepare(data: bytes, filename: str, language: str,
                   max_characters: int | None = None):
    """The file cut into documents to translate, on a thread (a small .docx can take seconds,
    which the event loop must not wait for); RequestError 400 for a file that cannot be,
    TooManyCharacters for one of more than `max_characters`."""
    try:
        return await asyncio.to_thread(document_files.prepare, data, filename, language,
                                       max_characters)
    except document_files.TooManyCharacters:
        raise  # a ValueError too, but the caller's to answer
    except ValueError as err:
        raise RequestError(400, f"Invalid request: {shown(filename, 60)}: {err}") from None


async def _translate_in_parts(service: Service, model, documents) -> list[str]:
    """The documents' translations, their sentences searched at most `part_sentences` at a
    time (each part within the request timeout and the queue's bound), so that a long file,
    one document or many, waits in the queue as a series of requests would."""
    sentences = [sentence for document in documents for sentence in document.sentences]
    step = service.limits.part_sentences
    translations = []
    for start in range(0, len(sentences), step):
        translations += (await translate_sentences(service, model,
                                                   sentences[start:start + step]))[0]
    return await join_documents(service, model, documents, translations)


async def download_file(request: Request) -> Response:
    service: Service = request.app.state.service
    name = request.path_params["name"]
    kept = service.files.get(name)
    if kept is None:
        raise RequestError(404, f"no translated file {shown(name, 60)}: files are kept "
                                f"{KEEP_SECONDS // 60} minutes after their translation; "
                                "translate it again")
    return Response(kept.data, media_type=kept.media_type,
                    headers={"Content-Disposition": content_disposition(kept.filename)})
