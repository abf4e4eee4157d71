"""Structured-output fields of a request, as OpenAI and vLLM name them, and the one
engine.api.Constraint they become.

  response_format  OpenAI: {"type": "text"} | {"type": "json_object"} |
                   {"type": "json_schema", "json_schema": {"name", "schema", "strict", ...}}
  structured_outputs  vLLM's current extra (its StructuredOutputsParams), exactly one of
                   {"json": schema, "regex": str, "choice": [str, ...], "grammar": EBNF, "json_object": true}
vLLM's older guided_json / guided_regex / guided_choice / guided_grammar / guided_decoding_backend
are refused with a 400 that names the current field, never silently ignored. Whether a
schema compiles is the engine's to say (xgrammar's message, a 400 too).
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.api import Constraint

MAX_CHOICES = 256
LEGACY_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
                 "guided_whitespace_pattern")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class JsonSchemaFormat(_Strict):
    name: str = Field("response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_needed(self):
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError('type "json_schema" needs json_schema.schema')
        return self


class StructuredOutputs(_Strict):
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    grammar: str | None = None
    json_object: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [k for k in ("json_", "regex", "choice", "grammar", "json_object") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar, json_object")
        if self.choice is not None and any(not c for c in self.choice):
            raise ValueError("choice: empty strings cannot be chosen")
        if self.json_object is False:
            raise ValueError("json_object: only true is meaningful")
        return self


def constraint_of(response_format: ResponseFormat | None, structured: StructuredOutputs | None) -> Constraint | None:
    if response_format is not None and response_format.type != "text":
        if structured is not None:
            raise ValueError("response_format and structured_outputs cannot be combined")
        if response_format.type == "json_object":
            return Constraint("json_object", field="response_format")
        return Constraint("json_schema", json.dumps(response_format.json_schema.schema_), "response_format")
    if structured is None:
        return None
    s, f = structured, "structured_outputs"
    if s.json_ is not None:
        return Constraint("json_schema", s.json_ if isinstance(s.json_, str) else json.dumps(s.json_), f)
    if s.regex is not None:
        return Constraint("regex", s.regex, f)
    if s.choice is not None:
        return Constraint("choice", tuple(s.choice), f)
    if s.grammar is not None:
        return Constraint("grammar", s.grammar, f)
    return Constraint("json_object", field=f)
