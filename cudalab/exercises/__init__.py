"""Student exercises: a kernel slot with a fixed signature and grid rule, a student's file
compiled, checked and timed through the slot's experiment (its inputs, CPU reference,
tolerance, poisoned outputs and the one timing harness), feedback for one file, and a
class run that judges a folder of submissions and ranks them beside the course's kernels.

  catalog    the exercises: slot, grid rule, sizes, the course's kernels, hints
  source     reading a submission: names, the forbidden directives, the course in the slot
  build      nvcc: diagnostics with file and line, the PTX signature, static analysis
  slots      numpy side of a slot: inputs, reference, check, first wrong element, geometry
  judge      the GPU side (a child process): checks, timed trials, the timing guard
  sandbox    runs the judge in a child under a per-launch wall-clock limit
  feedback   a verdict as text for the student
  classroom  submissions of a class, the leaderboard and the class report
  cli        `cudalab exercise ...`
"""
