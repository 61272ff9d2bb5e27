"""The default prompt set, by kind: code completion, code questions in chat form, prose."""

from __future__ import annotations


def chat(question: str) -> str:
    """A user turn in the ChatML form the Qwen family is tuned on, ready for the answer."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


PROMPTS = {
    "code": [
        "def quicksort(arr):",
        "import numpy as np\n\ndef moving_average(x, window):",
        "class LinkedList:\n    def __init__(self):",
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""',
    ],
    "chat": [
        chat("Write a Python function that checks whether a string is a palindrome."),
        chat("What is the difference between a list and a tuple in Python?"),
        chat("How do I read a CSV file with pandas?"),
    ],
    "prose": [
        "The history of the printing press",
        "Once upon a time, in a small village by the sea,",
        "The three most important qualities of a good teacher are",
    ],
}
