"""Reports: atomic writing, machine information (rendering and comparison come later)."""
from .io import machine_info, write_json_atomic, write_text_atomic

__all__ = ["machine_info", "write_json_atomic", "write_text_atomic"]
