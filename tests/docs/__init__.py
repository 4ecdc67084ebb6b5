"""The documentation's examples, run as written, and the pages' cross-references."""
