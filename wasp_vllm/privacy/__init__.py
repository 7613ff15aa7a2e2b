"""Differential privacy: accounting, the voting mechanisms, secrets, and which records take part."""
