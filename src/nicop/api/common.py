"""Pieces every API group shares: the model base, the CRD description of a kind, object metadata,
the Kubernetes core types that upstream embeds, and markers that drive the generated schema.

Field names are the upstream JSON names (camelCase aliases of the Python names), so a CR written
for the upstream operators parses unchanged. Attribute docstrings become the field descriptions
of the generated CRDs, which `kubectl explain` shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every model: camelCase JSON names, attribute docstrings as descriptions.

    Unknown fields are ignored rather than rejected: the API server already pruned them, and a
    field added upstream later must not stop the operator from reading an object.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="ignore",
    )


# --- schema markers -------------------------------------------------------------------------


@dataclass(frozen=True)
class JsonObjectString:
    """Marks a string field that must hold JSON.

    CEL cannot parse JSON, so the schema only checks the shape (braces around the text); the
    operator parses the value with `nicop.api.validate.json_fields` and reports the error.
    `many` means a comma-separated list of objects without the enclosing brackets (metaPlugins).
    """

    many: bool = False


@dataclass(frozen=True)
class Removed:
    """Marks a field that upstream removed but that old CRs still carry: kept, never used."""

    since: str
    why: str


JSON_SHAPE_RULE = r"self == '' || self.matches(r'^\s*\{[\s\S]*\}\s*$')"
"""Braces around the text (or nothing): as close to "is JSON" as CEL gets."""

JsonObject = Annotated[
    str,
    JsonObjectString(),
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": JSON_SHAPE_RULE, "message": "must be a JSON object ({...})"}
            ]
        }
    ),
]
"""A string holding one JSON object, such as a CNI `ipam` section or a device plugin config."""

JsonObjects = Annotated[
    str,
    JsonObjectString(many=True),
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": JSON_SHAPE_RULE,
                    "message": "must be JSON objects separated by commas ({...}, {...})",
                }
            ]
        }
    ),
]
"""A string holding JSON objects separated by commas, without brackets (CNI metaPlugins)."""

RemovedObject = Annotated[
    dict[str, Any] | None,
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""The schema of a removed field: whatever an old CR holds there is kept and ignored."""


IntOrPercent = Annotated[
    int | str,
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",
                    "message": "must be a non-negative number or a percentage from 0% to 100%",
                }
            ],
        }
    ),
]
"""A count of nodes or a percentage of them, like `maxUnavailable` in Kubernetes."""

Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
            r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        }
    ),
]
"""A resource quantity such as `500m` or `1Gi`."""


# --- the description of a kind ---------------------------------------------------------------


@dataclass(frozen=True)
class PrinterColumn:
    """A column of `kubectl get` (additionalPrinterColumns)."""

    name: str
    json_path: str
    type: str = "string"
    priority: int = 0


STATUS_AND_AGE = (
    PrinterColumn("Status", ".status.state"),
    PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
)


@dataclass(frozen=True)
class CrdInfo:
    """Everything about a kind that the CRD needs besides its schema."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    printer_columns: tuple[PrinterColumn, ...] = ()
    status_subresource: bool = True
    install_only_if_absent: bool = False
    """Another project owns this CRD: install it only when the cluster lacks it."""
    singular: str = ""
    """The singular resource name, when it is not the lowercase kind."""

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def singular_name(self) -> str:
        return self.singular or self.kind.lower()


# --- object metadata and the base of every kind ----------------------------------------------


class ObjectMeta(ApiModel):
    """The metadata of an object; every key the API server sends is kept."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    generation: int | None = None
    resource_version: str | None = None
    uid: str | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None


class KubeObject(ApiModel):
    """Base of every top-level kind; subclasses set `crd` and declare `spec` and `status`."""

    crd: ClassVar[CrdInfo]
    metadata_name_schema: ClassVar[dict[str, Any]] = {}
    """Extra schema of metadata.name, for kinds whose names upstream restricts."""

    api_version: str
    kind: str
    metadata: Annotated[ObjectMeta, WithJsonSchema({"type": "object"})] = Field(
        default_factory=ObjectMeta
    )

    @model_validator(mode="before")
    @classmethod
    def _type_meta(cls, data: Any) -> Any:
        """Fill apiVersion and kind, so models built in code need not repeat them."""
        if isinstance(data, dict):
            data = dict(data)
            data.setdefault("apiVersion", cls.crd.api_version)
            data.setdefault("kind", cls.crd.kind)
        return data

    def to_dict(self) -> dict[str, Any]:
        """The object as the API server takes it (JSON names, unset optional fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)



# --- core/v1 and meta/v1 types that upstream embeds -------------------------------------------


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration), copied into the pods the operator renders."""

    key: str | None = None
    """The taint key the toleration applies to; empty with operator Exists matches every taint."""
    operator: str | None = None
    """Exists or Equal (the default)."""
    value: str | None = None
    """The taint value the toleration matches (empty with Exists)."""
    effect: str | None = None
    """NoSchedule, PreferNoSchedule or NoExecute; empty matches all effects."""
    toleration_seconds: int | None = Field(default=None, json_schema_extra={"format": "int64"})
    """How long a NoExecute taint is tolerated before eviction; unset means forever."""


class EnvVar(ApiModel):
    """An environment variable of a container (core/v1 EnvVar)."""

    name: str
    """Name of the variable."""
    value: str | None = None
    """Value of the variable."""
    value_from: Annotated[
        dict[str, Any] | None,
        WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
    ] = None
    """Source of the value (configMapKeyRef, secretKeyRef, fieldRef, resourceFieldRef)."""


class NodeSelectorRequirement(ApiModel):
    """A requirement on a node label or field: key, operator and values."""

    key: str
    """The label key the requirement applies to."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How the key relates to the values."""
    values: list[str] | None = None
    """The values; empty for Exists and DoesNotExist, a single integer for Gt and Lt."""


class NodeSelectorTerm(ApiModel):
    """Requirements that are ANDed; an empty term matches no node."""

    match_expressions: list[NodeSelectorRequirement] | None = None
    """Requirements on node labels."""
    match_fields: list[NodeSelectorRequirement] | None = None
    """Requirements on node fields."""


class NodeSelector(ApiModel):
    """Node selector terms that are ORed (core/v1 NodeSelector)."""

    node_selector_terms: list[NodeSelectorTerm]
    """The terms; a node matching any of them is selected."""


class PreferredSchedulingTerm(ApiModel):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100)
    """Weight of the preference, 1 to 100."""
    preference: NodeSelectorTerm
    """The node selector term."""


class NodeAffinity(ApiModel):
    """Node affinity of a pod (core/v1 NodeAffinity)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes the pod may run on."""
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = (
        None
    )
    """Nodes the scheduler prefers."""


class LabelSelectorRequirement(ApiModel):
    """A requirement on a label: key, operator (In, NotIn, Exists, DoesNotExist) and values."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelector(ApiModel):
    """A label selector (meta/v1 LabelSelector); the requirements are ANDed."""

    match_labels: dict[str, str] | None = None
    """Labels that must all be present with these values."""
    match_expressions: list[LabelSelectorRequirement] | None = None
    """Further requirements on labels."""


class Condition(ApiModel):
    """One aspect of an object's state (meta/v1 Condition)."""

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    )
    """Type of the condition in CamelCase, e.g. Ready."""
    status: Literal["True", "False", "Unknown"]
    """Status of the condition."""
    observed_generation: int | None = Field(
        default=None, ge=0, json_schema_extra={"format": "int64"}
    )
    """The metadata.generation the condition was set for."""
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    """When the status last changed."""
    reason: str = Field(
        min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    )
    """Why the condition last changed, as a CamelCase identifier."""
    message: str = Field(max_length=32768)
    """Details for a human."""


Conditions = Annotated[
    list[Condition] | None,
    Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    ),
]
