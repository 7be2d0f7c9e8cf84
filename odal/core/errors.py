"""One refusal type for every surface.

Domain code raises `Refused` with a sentence for a person and a machine code; the API turns it
into `{"detail", "code", ...}` with its HTTP status, the `odal` command into a message on stderr
and its exit code (1 refused, 3 registry unreadable).
"""


class Refused(Exception):
    def __init__(self, detail: str, *, code: str, status: int = 409, exit_code: int = 1, **extra):
        super().__init__(detail)
        self.detail = detail
        self.code = code
        self.status = status
        self.exit_code = exit_code
        self.extra = extra

    def as_json(self) -> dict:
        return {"detail": self.detail, "code": self.code, **self.extra}
