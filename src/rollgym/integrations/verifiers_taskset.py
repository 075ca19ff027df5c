"""The verifiers 0.4 (v1) classes for a rollgym environment (see ``rollgym.integrations.verifiers``).

Importing this module imports verifiers. An Environments Hub package (what prime-rl's
``--env.taskset.id`` names) re-exports the two classes::

    from rollgym.integrations.verifiers_taskset import RollgymHarness, RollgymTaskset
    __all__ = ["RollgymHarness", "RollgymTaskset"]

- ``RollgymTaskset`` (config ``RollgymTasksetConfig``): rows from ``dataset`` (a task file) or
  ``env`` (a bundled environment's example rows); ``task.resources_url`` is the rollgym
  resources server.
- ``RollgymTask``: ``setup`` seeds the rollout's session; the reward ``rollgym`` verifies; a
  ``@stop`` ends the rollout once one of its tools' servers failed, another once a call found
  its ``max_tool_calls`` spent.
- ``RollgymToolset``: the taskset-wide MCP tool server (a process verifiers starts with
  ``python -m`` this module), calling the rollout's session; it is stateless between calls
  (the session travels in verifiers' rollout state).
- ``RollgymHarness``: verifiers' ``null`` chat loop (model -> MCP tools -> model ... no shell),
  the default harness of the Hub package: a rollgym environment's tools are its only tools.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer  # type: ignore[import-not-found, import-untyped, unused-ignore]
from mcp.types import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
    CallToolResult,
    TextContent,
    Tool,
)
from pydantic import Field
from verifiers.v1 import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
    State,
    Task,
    TaskConfig,
    TaskData,
    Taskset,
    TasksetConfig,
    Trace,
    reward,
    stop,
)
from verifiers.v1.dialects.responses import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
    ResponsesDialect,
)
from verifiers.v1.harnesses.null.harness import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
    NullHarness,
)
from verifiers.v1.mcp import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
    SharedToolsetConfig,
    Toolset,
)
from verifiers.v1.tasksets.nemo_gym.response import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
    trace_to_nemo_response,
)

from rollgym.errors import ConfigError, RollgymError
from rollgym.integrations.verifiers import (
    bundled_dataset,
    call_tool,
    failure_fields,
    load_rows,
    mcp_tools,
    recorded_failure,
    rollout_episode,
    verdict,
)
from rollgym.server.episode import MAX_TOOL_CALLS

__all__ = [
    "RollgymData",
    "RollgymHarness",
    "RollgymState",
    "RollgymTask",
    "RollgymTaskConfig",
    "RollgymTaskset",
    "RollgymTasksetConfig",
    "RollgymToolset",
]


class RollgymState(State):  # type: ignore[misc, unused-ignore]
    """One rollout's rollgym session, shared by the task hooks and the tool server."""

    resources_url: str = ""
    server: str = "resources"
    rollout: str = ""
    session_id: str | None = None
    cookies: dict[str, str] = Field(default_factory=dict)
    tool_timeout: float = 120.0
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """The MCP specs of the rollout's tools (``mcp_tools``)."""
    tool_calls: list[str] = Field(default_factory=list)
    """The tools called, in order (a tool's refusal counts; a failed call does not)."""
    max_tool_calls: int = MAX_TOOL_CALLS
    """The tool calls the rollout sends at most (the task config's)."""
    tool_calls_taken: int = 0
    """The calls taken from that budget so far (``Episode.tool_calls``)."""
    calls_spent: bool = False
    """A call found the budget spent: it was answered, not sent, and the rollout stops."""
    failure: dict[str, Any] | None = None
    """The first tool call whose server failed: the ``RollgymError`` as a dict."""


class RollgymTaskConfig(TaskConfig):  # type: ignore[misc, unused-ignore]
    resources_url: str | None = None
    """The rollgym resources server (``http://host:port``)."""
    server: str = "resources"
    """The name errors blame (the server's name in the rollgym config)."""
    tool_timeout: float = Field(120.0, gt=0)
    """Seconds for seed and each tool call, retries included."""
    verify_timeout: float = Field(300.0, gt=0)
    """Seconds for the verify call, retries included."""
    max_tool_calls: int = Field(MAX_TOOL_CALLS, ge=1)
    """Tool calls a rollout sends at most; a call past them is answered, never sent, and the
    rollout stops (as rollgym's tool agent's ``max_tool_calls``)."""


class RollgymTasksetConfig(TasksetConfig):  # type: ignore[misc, unused-ignore]
    dataset: str | None = None
    """A rollgym task file."""
    env: str | None = None
    """Else a bundled environment whose example rows to use (``lookup``, ``mcqa``, ...)."""
    tools: SharedToolsetConfig = SharedToolsetConfig()
    task: RollgymTaskConfig = RollgymTaskConfig()


class RollgymData(TaskData):  # type: ignore[misc, unused-ignore]
    row: dict[str, Any]
    """The task row as the file holds it: sent to ``/seed_session`` and ``/verify``."""


# -- the task -----------------------------------------------------------------------------------


class RollgymTask(Task[RollgymData, RollgymState, RollgymTaskConfig]):  # type: ignore[misc, unused-ignore]
    async def setup(self, trace: Any, runtime: Any) -> None:
        """Open the rollout's session; its tools are the row's, else the server's."""
        if not self.config.resources_url:
            raise ConfigError("set the rollgym resources server: --env.taskset.task.resources-url")
        state = trace.state
        state.resources_url = self.config.resources_url.rstrip("/")
        state.server = self.config.server
        state.rollout = trace.id
        state.tool_timeout = self.config.tool_timeout
        state.max_tool_calls = self.config.max_tool_calls
        episode = rollout_episode(state)
        await self._raising(trace, episode.seed(self.data.row))
        state.session_id = episode.session_id
        state.cookies = dict(episode.cookies)
        declared = self.data.row["responses_create_params"].get("tools")
        tools = declared if declared else await self._raising(trace, episode.tools())
        state.tools = mcp_tools(tools)

    @stop  # type: ignore[untyped-decorator, misc, unused-ignore]
    async def tool_server_failed(self, trace: Trace) -> bool:
        """Stop before the next model call once a tool's server failed: the rollout is lost."""
        return trace.state.failure is not None

    @stop  # type: ignore[untyped-decorator, misc, unused-ignore]
    async def tool_calls_spent(self, trace: Trace) -> bool:
        """Stop before the next model call once a call found ``max_tool_calls`` spent: the
        rollout is scored as it stands, as rollgym's agent ends one truncated."""
        return bool(trace.state.calls_spent)

    @reward(weight=1.0)  # type: ignore[untyped-decorator, misc, unused-ignore]
    async def rollgym(self, trace: Any) -> float:
        """The rollgym verifier's reward (``/verify``); a failure raises, never scores 0."""
        state = trace.state
        if state.failure is not None:
            await self._raising(trace, _reraise(recorded_failure(state.failure)))
        params = self.data.row["responses_create_params"]
        names = [spec["name"] for spec in state.tools]
        response = trace_to_nemo_response(trace, params, names)
        episode = rollout_episode(state, self.config.verify_timeout)
        verified = await self._raising(trace, episode.verify(self.data.row, response))
        try:
            checked = verdict(verified, server=state.server)
        except RollgymError as err:
            trace.info["rollgym_error"] = failure_fields(err)
            raise
        trace.info["rollgym"] = checked.info
        trace.record_metrics(checked.metrics)
        return checked.reward

    @staticmethod
    async def _raising(trace: Any, work: Any) -> Any:
        """``await work``, keeping a rollgym failure's plain fields on the trace first
        (verifiers records the exception itself as a ``TaskError``)."""
        try:
            return await work
        except RollgymError as err:
            trace.info["rollgym_error"] = failure_fields(err)
            raise


async def _reraise(error: RollgymError) -> None:
    raise error


# -- the tools --------------------------------------------------------------------------------


class RollgymToolset(Toolset[SharedToolsetConfig, RollgymState]):  # type: ignore[misc, unused-ignore]
    """The rollout's rollgym tools over MCP (one server for the taskset)."""

    TOOL_PREFIX = None  # the model sees the environment's own tool names

    def register(self, mcp: MCPServer) -> None:
        # The tool list differs per rollout (a row may declare its own), so the handlers are
        # replaced rather than registering a fixed schema.
        server: Any = mcp
        server.list_tools = self._with_state(self.list_tools)
        server.call_tool = self._with_state(self.call_tool)

    async def list_tools(self) -> list[Tool]:
        return [
            Tool(
                name=spec["name"],
                description=spec.get("description"),
                input_schema=spec.get("input_schema") or {},
            )
            for spec in self.state.tools
        ]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Any = None
    ) -> CallToolResult:
        text, is_error = await call_tool(self.state, name, arguments)
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)


# -- the taskset and its harness ----------------------------------------------------------------


class RollgymTaskset(Taskset[RollgymTask, RollgymTasksetConfig]):  # type: ignore[misc, unused-ignore]
    """The rows of a rollgym task file as verifiers tasks."""

    @classmethod
    def toolsets(cls, config: RollgymTasksetConfig) -> list[Any]:
        return [RollgymToolset(config.tools)]

    def load(self) -> Any:
        if self.config.dataset:
            path = self.config.dataset
        elif self.config.env:
            path = str(bundled_dataset(self.config.env))
        else:
            raise ConfigError("set --env.taskset.dataset (a task file) or --env.taskset.env")
        dialect = ResponsesDialect()
        stem = path.rsplit("/", 1)[-1].removesuffix(".jsonl")
        for index, row in enumerate(load_rows(path)):
            request = dialect.parse_request(row["responses_create_params"])
            yield RollgymTask(
                RollgymData(name=f"{stem}:{index}", prompt=request.messages, row=row),
                self.config.task,
            )


class RollgymHarness(NullHarness):  # type: ignore[misc, unused-ignore]
    """verifiers' ``null`` chat loop: model calls and the environment's MCP tools, nothing
    else (no shell), as rollgym's tool agent."""


if __name__ == "__main__":
    RollgymToolset.run()
