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
    "repeat": [  # code of some length, so that the reply's copy outlasts the prompt's reading
        chat("Add type hints to these functions:\n```python\ndef merge_intervals(intervals):\n"
             "    if not intervals:\n        return []\n    intervals = sorted(intervals, key=lambda pair: pair[0])\n"
             "    merged = [intervals[0]]\n    for start, end in intervals[1:]:\n"
             "        last_start, last_end = merged[-1]\n        if start <= last_end:\n"
             "            merged[-1] = (last_start, max(last_end, end))\n        else:\n"
             "            merged.append((start, end))\n    return merged\n\n\ndef total_covered(intervals):\n"
             "    total = 0\n    for start, end in merge_intervals(intervals):\n        total += end - start\n"
             "    return total\n```"),
        chat("Rename x to count in this code:\n```python\ndef tally(words, stop_words):\n    x = {}\n"
             "    for word in words:\n        word = word.lower().strip(\".,;:!?\")\n"
             "        if not word or word in stop_words:\n            continue\n        if word in x:\n"
             "            x[word] += 1\n        else:\n            x[word] = 1\n"
             "    ranked = sorted(x.items(), key=lambda item: item[1], reverse=True)\n"
             "    return x, ranked[:10]\n```"),
        chat("Add a docstring to each method of this class:\n```python\nclass Stack:\n"
             "    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
             "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
             "    def peek(self):\n        return self.items[-1]\n\n"
             "    def is_empty(self):\n        return not self.items\n\n    def size(self):\n"
             "        return len(self.items)\n```"),
    ],
}
