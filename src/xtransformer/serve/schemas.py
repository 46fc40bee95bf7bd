"""The request and response models of ``POST /predict`` and the error body (pydantic), with the
server's limits written into them (the OpenAPI schema says what a request may hold)."""

# no `from __future__ import annotations`: FastAPI and pydantic read these annotations at run time
from types import SimpleNamespace
from typing import Any, Literal

from xtransformer.serve.limits import Limits


def api_schemas(limits: Limits) -> Any:
    """``PredictRequest``, ``PredictResponse`` and ``Error`` for ``limits`` (pydantic imported here,
    when an app is built)."""
    from pydantic import BaseModel, ConfigDict, Field

    class PredictRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        texts: list[str] = Field(
            description=f"documents to label: at most {limits.max_texts} texts of at most "
            f"{limits.max_text_chars} characters (more: 413)",
            json_schema_extra={
                "maxItems": limits.max_texts,
                "items": {"type": "string", "maxLength": limits.max_text_chars},
            },
        )
        k: int = Field(
            5,
            description=f"labels per document, 1..{limits.max_k} (the k best; not used by decisions)",
            json_schema_extra={"minimum": 1, "maximum": limits.max_k},
        )
        decision: Literal["topk", "threshold", "per_label"] | None = Field(
            None,
            description="a calibrated model: topk (the k best), threshold (every label whose probability "
            "reaches `threshold`) or per_label (each label's tuned threshold); default: the model's",
        )
        threshold: float | None = Field(None, description="a probability in [0, 1]; alone it asks for decisions")
        min_labels: int | None = Field(None, description="labels a document always gets (its most probable)")
        max_labels: int | None = Field(None, description="labels a document gets at most")

        def decision_fields(self) -> dict[str, Any]:
            return {k: getattr(self, k) for k in ("decision", "threshold", "min_labels", "max_labels")}

    class Prediction(BaseModel):
        labels: list[str]
        names: list[str]
        scores: list[float]
        probabilities: list[float] | None = Field(None, description="a calibrated model's probability of each label")

    class PredictResponse(BaseModel):
        predictions: list[Prediction]

    class Error(BaseModel):
        error: str = Field(description="what was wrong, one line")
        field: str | None = Field(None, description="the request field at fault, e.g. texts[3], k, body")

    return SimpleNamespace(PredictRequest=PredictRequest, PredictResponse=PredictResponse, Error=Error)
