"""The in-process runners, one module each, and what they share."""
