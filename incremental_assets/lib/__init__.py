"""How it works: the machinery the definitions under defs/ are made of. Imports nothing from defs/ or cli/, and holds no Definitions."""
