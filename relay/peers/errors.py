"""Errors of the peers and the exit codes the commands document."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1  # unexpected failure, no relay reachable, bad input file
EXIT_USAGE = 2  # click's own code for bad options
EXIT_NOT_FOUND = 3  # no publication of the prompt's prefix on any relay
EXIT_PARTIAL = 4  # some layers could not be retrieved in time (or by the deadline)
EXIT_REFUSED = 5  # publications were found but failed verification (compat, COSE)
EXIT_UNCONFIRMED = 6  # publish: a relay did not confirm every Object
EXIT_UNVERIFIED = 7  # --require-cose: Objects no signed manifest version listed in time
EXIT_UNAUTHORIZED = 8  # the relay refused the requests as UNAUTHORIZED (--token)
EXIT_UNREACHABLE = 9  # nothing found, and a relay could not reach its upstream to look


class PeerError(Exception):
    """A failure with a one-line message and the exit code a command reports for it."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        # what a retrieval knew when it failed (its --report), set by the subscriber
        self.report: dict[str, Any] | None = None


class InputError(PeerError):
    exit_code = EXIT_ERROR


class NotFound(PeerError):
    exit_code = EXIT_NOT_FOUND


class Refused(PeerError):
    exit_code = EXIT_REFUSED


class Unconfirmed(PeerError):
    exit_code = EXIT_UNCONFIRMED


class Unauthorized(PeerError):
    """The relay refused the command's requests with UNAUTHORIZED: a missing or wrong
    ``--token``, or one not granted this scope."""

    exit_code = EXIT_UNAUTHORIZED


class UpstreamUnreachable(PeerError):
    """Nothing was found, but a relay answered REQUEST_ERROR TIMEOUT: it could not reach
    its upstream relay to look. Whether a publication exists is unknown, so this is not
    "no publication" (exit 3): the consumer can retry later or use another relay."""

    exit_code = EXIT_UNREACHABLE
