from django.conf import settings
from django.http import JsonResponse


class BodySizeLimitMiddleware:
    """Refuse an API request whose declared body is over ODAL_MAX_BODY_BYTES with 413, before
    anything reads it. (A body without a length is cut off by DATA_UPLOAD_MAX_MEMORY_SIZE when
    read, which the API's error handler turns into the same 413.)"""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith("/vault/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > settings.ODAL_MAX_BODY_BYTES:
                return JsonResponse(body_too_large(), status=413)
        return self.get_response(request)


def body_too_large() -> dict:
    return {
        "detail": f"The request body is larger than {settings.ODAL_MAX_BODY_BYTES} bytes.",
        "code": "body_too_large",
    }
