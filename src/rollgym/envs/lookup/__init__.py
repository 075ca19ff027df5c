"""Tool-calling environment: answer questions from a fictional registry via a ``lookup`` tool."""
