"""The agent's reading of the controller's answers: what it refuses, and what it says."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.errors import AgentError, ControllerError, ProtocolError
from agent.protocol import (
    ErrorInfo,
    FinishedAttempt,
    PollReply,
    PollRequest,
    ResultRequest,
    RunningAttempt,
)

WHAT_TO_DO = "install the agent this controller ships"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ([], "PollReply: expected an object (PollReply), got []"),
        ({"lease": 90}, "PollReply.now: missing from the controller's answer"),
        ({"lease": True, "now": 1}, "PollReply.lease: expected a number, got True"),
        ({"lease": 90, "now": 1, "drain": "yes"}, "PollReply.drain: expected true or false"),
        (
            {"lease": 90, "now": 1, "assignments": [{"job": 7}]},
            "PollReply.assignments[0].job: expected a string, got 7",
        ),
        (
            {"lease": 90, "now": 1, "stop": [{"job": "j", "attempt": "a", "reason": "bored"}]},
            "PollReply.stop[0].reason: expected one of 'cancelled', 'stale', got 'bored'",
        ),
        ({"lease": 90, "now": 1, "stop": {}}, "PollReply.stop: expected a list, got {}"),
    ],
)
def test_a_malformed_answer_names_the_field_and_what_to_do(answer: Any, message: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        PollReply.from_json(answer)
    assert str(caught.value).startswith(message)
    assert str(caught.value).endswith(WHAT_TO_DO)
    # a bad answer is a controller error like any other: retried, never a crash of the loop
    assert isinstance(caught.value, ControllerError) and isinstance(caught.value, AgentError)


def test_unknown_fields_are_ignored_and_numbers_are_numbers() -> None:
    reply = PollReply.from_json({"lease": 90, "now": 1, "later": {"added": True}})
    assert (reply.lease, reply.now, reply.assignments, reply.drain) == (90.0, 1.0, (), False)
    assert isinstance(reply.lease, float)


def test_what_the_agent_sends_has_every_field() -> None:
    assert ResultRequest(status="cancelled").to_json() == {
        "status": "cancelled",
        "result": None,
        "error": None,
        "posted": None,
    }


def test_a_poll_dumps_nested_messages_and_any_json_result_as_json() -> None:
    result = {"ok": True, "n": 3, "ratio": 0.5, "tags": ("a", "b"), "none": None, "deep": [{}]}
    poll = PollRequest(
        running=(RunningAttempt(job="j1", attempt="a1", posted=0.002, fresh=True),),
        free_slots=2,
        wait=20,
        results=(
            FinishedAttempt(job="j2", attempt="a2", status="success", result=result),
            FinishedAttempt(
                job="j3", attempt="a3", status="failed",
                error=ErrorInfo(code="timeout", reason="late", status=504),
            ),
        ),
    )  # fmt: skip
    dumped = poll.to_json()
    assert dumped == {
        "running": [{"job": "j1", "attempt": "a1", "posted": 0.002, "fresh": True}],
        "free_slots": 2,
        "wait": 20,
        "refill": False,
        "beside": False,
        "results": [
            {"job": "j2", "attempt": "a2", "status": "success", "posted": None, "error": None,
             "result": {**result, "tags": ["a", "b"]}},
            {"job": "j3", "attempt": "a3", "status": "failed", "posted": None, "result": None,
             "error": {"code": "timeout", "reason": "late", "status": 504}},
        ],
    }  # fmt: skip
    assert json.loads(json.dumps(dumped)) == dumped
