"""The seed's utilities (GPU detection, benchmark runner, validators) grow here; see validation.py."""

from .validation import ErrorReport, attention_error_reports, error_report

__all__ = ["ErrorReport", "attention_error_reports", "error_report"]
