"""Example environment and precision plugins for stratagem; users never import this package."""
