"""Fixtures shared by core's tests."""

from fake_plugins import fake

__all__ = ["fake"]
