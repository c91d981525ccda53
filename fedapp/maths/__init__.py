"""Method maths shared by a method's two sides, framework-free: FSTC's and gFedNTM's, clustering kernels,
losses."""
