"""Documents named by id in a request: their text from the document table of the caller's tenant, 404 if unknown."""
from typing import TypeVar

from cluster.api.request_models import ApiError, ChatCompletionRequest, CompletionRequest, Document
from cluster.ingest.table import DocumentRecord, DocumentTable

RequestT = TypeVar("RequestT", ChatCompletionRequest, CompletionRequest)


def unknown_document(doc_id: str, param: str | None = None) -> ApiError:
    """A 404 naming the id the tenant has no document under."""
    where = f"{param}: " if param else ""
    message = (f"{where}no document {doc_id[:80]!r} for this tenant (ingest it with `blendserve ingest`, "
               f"or send its text)")
    return ApiError(404, message, param, "document_not_found")


def resolve_documents(request: RequestT, table: DocumentTable, tenant: str) -> RequestT:
    """The request with each id-only document's text filled in from the tenant's table (404 naming an unknown id).

    A document with both id and text keeps its text: the id is then only a label, as it always was.
    """
    if all(document.text is not None for document in request.documents):
        return request
    resolved = []
    for index, document in enumerate(request.documents):
        if document.text is None:
            record = table.get(tenant, document.id or "")
            if record is None:
                raise unknown_document(document.id or "", f"documents[{index}].id")
            document = Document(id=document.id, text=record.text)
        resolved.append(document)
    return request.model_copy(update={"documents": resolved})


def find_document(table: DocumentTable, tenant: str, doc_id: str) -> DocumentRecord:
    """The tenant's document of that id, or a 404 naming it."""
    record = table.get(tenant, doc_id)
    if record is None:
        raise unknown_document(doc_id)
    return record
