"""Test helpers shared by the workbench's test suite (scripted LLM, real-agent harnesses)."""
