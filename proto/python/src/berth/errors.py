"""Every failure is a `BerthError` carrying the gRPC status code and the server's message."""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc


class BerthError(Exception):
    """A call the gateway refused or could not answer.

    `code` is the gRPC status code (`grpc.StatusCode`); `message` is the server's, which names
    the offending field for bad input.
    """

    code: grpc.StatusCode

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidArgument(BerthError):
    """Bad input: the message names the field."""


class NotFound(BerthError):
    """No sandbox, snapshot, provider, template or exec of that name."""


class AlreadyExists(BerthError):
    """The name is taken (or an exec id names another command)."""


class FailedPrecondition(BerthError):
    """Not in this phase: a start while Stopping, an exec in a sandbox that is not Ready, a
    snapshot whose copy failed or that a sandbox made from it still needs..."""


class Aborted(BerthError):
    """The record is not at the expected version: read it again and decide again."""


class Unavailable(BerthError):
    """The gateway or its store cannot answer now; retrying later may succeed."""


class Unauthenticated(BerthError):
    """No token, or not the gateway's."""


class DeadlineExceeded(BerthError):
    """The call's deadline passed before the gateway answered."""


class SandboxFailed(BerthError):
    """A sandbox waited for landed in Error."""

    def __init__(self, name: str, reason: str, message: str) -> None:
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, f"sandbox '{name}' failed: {reason} ({message})")
        self.reason = reason


class ExecTimeout(BerthError, TimeoutError):
    """An exec ran past its `timeout`, and the gateway ended it. As `subprocess.TimeoutExpired`,
    it carries what the command wrote: `stdout`, `stderr`, and the whole `result`."""

    def __init__(self, sandbox: str, timeout: float, result) -> None:
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, f"exec {result.exec.id} in '{sandbox}' timed out after {timeout}s")
        self.timeout = timeout
        self.result = result
        self.stdout = result.stdout
        self.stderr = result.stderr


class WaitTimeout(BerthError):
    """A sandbox did not reach the phase waited for in time (or a deleted snapshot did not go).
    The command goes on at the gateway."""

    def __init__(self, name: str, phase: str, timeout: float) -> None:
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, f"'{name}' did not reach {phase} within {timeout}s")


_BY_CODE: Dict[grpc.StatusCode, Type[BerthError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def from_rpc(error: grpc.RpcError) -> BerthError:
    """The `BerthError` for a failed call."""
    code: Optional[grpc.StatusCode] = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    code = code or grpc.StatusCode.UNKNOWN
    return _BY_CODE.get(code, BerthError)(code, details or str(error))
