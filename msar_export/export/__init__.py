from .contracts import CONTRACTS, DOMAIN
from .exporter import ExportOptions, ExportReport, export_checkpoint, export_model

__all__ = ["CONTRACTS", "DOMAIN", "ExportOptions", "ExportReport", "export_checkpoint", "export_model"]
