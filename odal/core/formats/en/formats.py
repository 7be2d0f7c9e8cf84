"""The admin's dates and times (FORMAT_MODULE_PATH): one format everywhere, to the second, with
the zone's name, as odal.core.record.when writes them: "2026-12-05 19:53:21 UTC"."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = DATETIME_FORMAT
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = DATE_FORMAT
TIME_FORMAT = "H:i:s"
