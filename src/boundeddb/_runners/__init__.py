"""The public runner classes, one module each, and what they share."""
