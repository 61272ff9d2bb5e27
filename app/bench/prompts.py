"""The default prompt set, by kind: code completion, code questions in chat form, prose, and
requests whose answer repeats the question's code ("repeat": edits, renames, annotations,
where copying the context drafts well; a kind of its own so the others stay comparable
with earlier runs)."""

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
    "repeat": [
        chat("Add type hints to this function:\n```python\ndef moving_average(values, window):\n"
             "    result = []\n    for i in range(len(values) - window + 1):\n        chunk = values[i:i + window]\n"
             "        result.append(sum(chunk) / window)\n    return result\n```"),
        chat("Rename x to count in this code:\n```python\ndef tally(words):\n    x = {}\n    for word in words:\n"
             "        if word in x:\n            x[word] += 1\n        else:\n            x[word] = 1\n"
             "    return x\n```"),
        chat("Add a docstring to each method of this class:\n```python\nclass Stack:\n"
             "    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
             "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
             "    def is_empty(self):\n        return not self.items\n```"),
    ],
}
