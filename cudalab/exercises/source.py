"""Reading a submission: its student id, its exercise, and the directives it may not use.

A submission is compiled alone in an empty folder with no include path, and it may not use
#include (or #embed, #line, __has_include): so it cannot pull the course's kernels, a
reference solution or another student's file into its own build, and nvcc's messages name
only its own lines. The check runs on the text as the preprocessor sees it: backslash-
newlines spliced and comments removed first, so `#/**/include` or a split `# \\ include`
do not slip through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cudalab import safe_io
from cudalab.exercises.catalog import EXERCISES, CourseKernel, Exercise
from cudalab.resources import CUDA_DIR

# A student id and a submission's file stem: they become file names and wildcards of the
# class run's jobs, so letters, digits, _ and - only, a letter or digit first.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
_NAME = re.compile(NAME_PATTERN)
MAX_BYTES = 256 * 1024
MARKER = re.compile(r"^\s*//\s*cudalab-exercise:\s*([A-Za-z0-9_]+)\s*$", re.M)
# '#' may be spelled '%:' (its digraph) or '??=' (its trigraph); space, tab, form feed and
# vertical tab are whitespace to the preprocessor, and a lone CR ends a line for it.
_FORBIDDEN = re.compile(r"^[ \t\f\v]*(#|%:|\?\?=)[ \t\f\v]*"
                        r"(include|include_next|import|embed|line)\b|__has_include", re.M)


class SubmissionError(ValueError):
    """A submission that is refused before nvcc sees it (the message says why)."""


@dataclass(frozen=True)
class Submission:
    student: str
    path: Path
    text: str
    exercise: Exercise


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def student_of(path: Path, root: Path | None = None) -> str:
    """The student id of a submission: its folder's name where it lies in a folder of the
    class folder (root/<student>/file.cu), else its file's stem (root/<student>.cu)."""
    if root is not None and path.parent != root:
        return path.relative_to(root).parts[0]
    return path.stem


def preprocessed_view(text: str) -> str:
    """The text with line ends made \\n (CRLF and a lone CR alike), backslash-newlines
    spliced and comments blanked (string and character literals kept), as the
    preprocessor's first phases see it."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\\\n", "")
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def forbidden(text: str) -> list[str]:
    """The directives of `text` a submission may not use, as the preprocessor sees them."""
    return sorted({" ".join(m.group(0).split())
                   for m in _FORBIDDEN.finditer(preprocessed_view(text))})


def exercise_of(text: str, default: str | None = None) -> Exercise:
    """The exercise a file is for: its `// cudalab-exercise: NAME` line, else `default`."""
    m = MARKER.search(text)
    name = m.group(1) if m else default
    if name is None:
        raise SubmissionError("the file does not say which exercise it is: keep the starter's "
                              "first line `// cudalab-exercise: NAME` (one of "
                              f"{', '.join(EXERCISES)}) or pass --exercise NAME")
    if default is not None and m and m.group(1) != default:
        raise SubmissionError(f"the file is for exercise {m.group(1)!r}, this run judges "
                              f"{default!r}")
    if name not in EXERCISES:
        raise SubmissionError(f"no exercise {name!r}; there are: {', '.join(EXERCISES)}")
    return EXERCISES[name]


def read_submission(path: Path, exercise: str | None = None, student: str | None = None
                    ) -> Submission:
    """A submission read and checked: size, encoding, forbidden directives, exercise."""
    student = student or path.stem
    if not valid_name(student):
        raise SubmissionError(f"student id {student!r} is not allowed: 1 to 64 letters, "
                              "digits, _ or -, starting with a letter or digit")
    try:  # a regular file of at most MAX_BYTES: a FIFO or /dev/zero is refused unread
        data = safe_io.read_bytes(path, MAX_BYTES)
    except safe_io.InputRefused as exc:
        raise SubmissionError(f"cannot read the submission: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubmissionError(f"{path.name} is not UTF-8 text (byte {exc.start})") from None
    if "\0" in text:
        raise SubmissionError(f"{path.name} holds NUL bytes: not a source file")
    bad = forbidden(text)
    if bad:
        raise SubmissionError(f"{path.name} uses {', '.join(bad)}: a submission is compiled "
                              "alone, so #include, #embed, #line and __has_include are not "
                              "allowed (CUDA's own headers are already included)")
    return Submission(student, path, text, exercise_of(text, exercise))


def course_source(ex: Exercise, kernel: CourseKernel) -> str:
    """The course's kernel put in the slot: its file with the kernel renamed to the slot's
    name (a kernel already called so is renamed out of the way) and its extra defines."""
    text = (CUDA_DIR / kernel.file).read_text()
    if kernel.kernel != ex.kernel:
        text = re.sub(rf"\b{re.escape(ex.kernel)}\b", f"{ex.kernel}_course_other", text)
        text = re.sub(rf"\b{re.escape(kernel.kernel)}\b", ex.kernel, text)
    head = "".join(f"#define {k} {v}\n" for k, v in kernel.defines.items())
    return f"// cudalab-exercise: {ex.name}\n{head}{text}"
