"""The requests the harness sends its workers: one pydantic model per op, read back by `parse_request` (a union
discriminated on `op`). Each names the model of its reply (`Request[XReply]`: `messages`). Which role answers
which op is the workers' tables (`worker.main.ROLES`); an op outside a worker's table is refused.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, TypeAdapter, model_serializer

from kernelbench_eval.messages import (
    CheckReply,
    ExchangeInfo,
    ExchangeReply,
    ExpectReply,
    ExportReply,
    ImportReply,
    LoadReply,
    PrepareReply,
    ProfileReply,
    PutReply,
    Reply,
    RunReply,
    Slot,
    TensorMeta,
    TimeReply,
)
from kernelbench_eval.records import Device

R = TypeVar("R", bound=Reply)


class Request(BaseModel, Generic[R]):
    """A command sent to a worker on its stdin, one JSON object a line; `Request[XReply]`: answered by an XReply."""

    model_config = ConfigDict(extra="forbid")
    reply: ClassVar[type[Reply]] = Reply
    op: str

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        args = cls.__pydantic_generic_metadata__["args"]  # set on `Request[XReply]`, inherited by its subclass
        if args:
            cls.reply = args[0]

    @model_serializer(mode="wrap")
    def _with_op(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The op always goes on the wire, even where the sender drops default values (`exclude_defaults`)."""
        return {"op": self.op, **handler(self)}


class ImportRequest(Request[ImportReply]):  # build: import a candidate's module (building its extensions)
    op: Literal["import"] = "import"
    path: str
    class_name: str | None = None  # checked to be a class there
    problem: str | None = None  # the candidate's module starts with the problem's names, sized by `dims`
    dims: dict[str, int | float] = Field(default_factory=dict)


class WarmupRequest(Request[ImportReply]):  # build: one call of ModelNew on problem-shaped inputs (`worker.warmup`)
    op: Literal["warmup"] = "warmup"
    path: str
    problem: str  # the problem file whose Model/get_inputs shape the call
    dims: dict[str, int | float] = Field(default_factory=dict)
    device: Device | None = None
    init_seed: int | None = None
    precision: str | None = None  # cast inputs and model (`precision.py`); None is fp32


class LoadRequest(Request[LoadReply]):  # build a model from a module file and the init arguments
    op: Literal["load"] = "load"
    path: str
    class_name: str | None = None
    model: str = "main"  # its name in the worker: "main", or "compiled" for the torch.compile baseline
    init_file: str | None = None
    init_seed: int | None = None
    device: Device | None = None
    dims: dict[str, int | float] = Field(default_factory=dict)
    threads: int | None = None
    problem: str | None = None  # a candidate's module starts with the problem's names (`worker.namespace`)
    precision: str | None = None
    compile_mode: str | None = None  # wrap the model in torch.compile (the compile baseline)


class ProfileRequest(Request[ProfileReply]):  # launch accounting of one forward, after `warmup` calls
    op: Literal["profile"] = "profile"
    name: str | None = None  # an input set the worker holds, or
    inputs_file: str | None = None  # the inputs to profile on (`kbeval profile`)
    model: str = "main"
    warmup: int = 0


class PrepareRequest(Request[PrepareReply]):  # checker: the problem, its init arguments, one input set per seed
    op: Literal["prepare"] = "prepare"
    path: str
    dims: dict[str, int | float] = Field(default_factory=dict)
    device: Device | None = None  # where the input sets are drawn (`draw_inputs`)
    precision: str | None = None
    trial_seeds: list[int] = Field(default_factory=list)
    timing_seeds: list[int] = Field(default_factory=list)
    inputs_dir: str | None = None  # where init.pt goes (inputs stay in the worker's memory)
    save_inputs: bool = False  # also save each input set there (`kbeval profile`; seeds not secret)


class ExpectRequest(Request[ExpectReply]):  # checker: every trial's expected outputs, under the memory budget
    op: Literal["expect"] = "expect"
    trial_seeds: list[int] = Field(default_factory=list)
    timing_seeds: list[int] = Field(default_factory=list)
    atol: float = 0.0  # the tolerances every later comparison uses
    rtol: float = 0.0
    memory_budget: int | None = None  # bytes (None: the device's free memory, `memory.SHARE` of it)
    memory_share: float = 1.0  # the share of it this checker may plan with (lanes on one device share it)


class ParkRequest(Request[Reply]):  # checker: free what only a timing needed
    op: Literal["park"] = "park"


class OpenExchangeRequest(Request[ExchangeReply]):  # checker: a fresh exchange buffer to lend a candidate
    op: Literal["open_exchange"] = "open_exchange"
    size: int
    shm_dir: str | None = None  # where a shared file may go
    prefer_ipc: bool = True  # CUDA: by CUDA IPC where it works (False: a shared file, IPC was refused)


class CloseExchangeRequest(Request[Reply]):
    op: Literal["close_exchange"] = "close_exchange"


class PutRequest(Request[PutReply]):  # checker: write input set `name` into the exchange
    op: Literal["put"] = "put"
    name: str


class CompareRequest(Request[CheckReply]):  # checker: a trial's outputs, as the candidate described and left them
    op: Literal["compare"] = "compare"
    trial: int = 0
    slots: list[Slot] = Field(default_factory=list)
    outputs: list[TensorMeta] = Field(default_factory=list)


class CompareTimedRequest(Request[CheckReply]):  # checker: calls of the last timed block, where they lie
    op: Literal["compare_timed"] = "compare_timed"
    calls: list[int] = Field(default_factory=list)
    layout: list[list[Slot]] = Field(default_factory=list)
    metas: list[list[TensorMeta]] = Field(default_factory=list)


class AttachRequest(Request[Reply]):  # candidate: reach the exchange the checker lent it
    op: Literal["attach"] = "attach"
    exchange: ExchangeInfo
    placements: int = 0  # live input buffers its timed calls use (the checker's `memory` plan); 0: the default


class TakeRequest(Request[Reply]):  # candidate: copy input set `name` out of the exchange
    op: Literal["take"] = "take"
    name: str
    slots: list[Slot] = Field(default_factory=list)
    drop: bool = False  # drop every set held first
    in_place: bool = False  # read it where it lies, no copy, where the exchange is on the model's device (lean plan)


class RunRequest(Request[RunReply]):  # candidate: one trial run on set `name`, its outputs into `slots`
    op: Literal["run"] = "run"
    name: str
    slots: list[Slot] = Field(default_factory=list)
    sentinel: int | None = None  # fill free memory with this byte first


class ExportRequest(Request[ExportReply]):  # candidate: what calls of the last timed block gave (none: a wake-up)
    op: Literal["export"] = "export"
    calls: list[int] = Field(default_factory=list)


class TimeRequest(Request[TimeReply]):
    """One call per (base set, scale, seed) of `schedule` on rotating inputs from `input_sets` (`worker.timed`)."""

    op: Literal["time"] = "time"
    model: str = "main"
    input_sets: list[str] = Field(default_factory=list)
    schedule: list[tuple[int, float, int]] = Field(default_factory=list)
    warmup: int = 0
    warmup_seconds: float = 0.0
    # with a warm-up, so once a measurement: how its calls are timed, the harness's way or KernelBench's
    method: str = "kbeval"
    graph: bool = False
    first: int = 0  # the index in its block of this request's call: calls are sent one at a time (`measure`)
    layout: list[list[Slot]] = Field(default_factory=list)  # a candidate's: the slots its outputs go to
    placement: int = 0  # which of the worker's input placements this call uses (`refill.Rotation`)
    cover_s: float = 0.0  # CUDA: the launch cover before each call, the same for every model (`measure`)
    # CUDA: answer once the call is launched and described; its times come with the next reply, and the block
    # ends with a request of no calls, answered once the last call's device work is done (`measure.overlaps`)
    overlap: bool = False


class ExitRequest(Request[Reply]):  # the polite end: the worker leaves its loop, unanswered
    op: Literal["exit"] = "exit"


MODELS = (ImportRequest, WarmupRequest, LoadRequest, ProfileRequest, PrepareRequest, ExpectRequest, ParkRequest,
          OpenExchangeRequest, CloseExchangeRequest, PutRequest, CompareRequest, CompareTimedRequest, AttachRequest,
          TakeRequest, RunRequest, ExportRequest, TimeRequest, ExitRequest)
REQUESTS: dict[str, type[Request[Any]]] = {model.model_fields["op"].default: model for model in MODELS}  # by op
_PARSER: TypeAdapter[Request[Any]] = TypeAdapter(Annotated[Union[MODELS], Field(discriminator="op")])  # noqa: UP007


def parse_request(line: str | bytes) -> Request[Any]:
    """The request on one line, as the model its `op` names; a ValueError when it is none of them."""
    return _PARSER.validate_json(line)
