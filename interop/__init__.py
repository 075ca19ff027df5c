"""Interoperability suite against the real nemo-gym==0.4.0 (see interop/README.md)."""
