import sys
from pathlib import Path

# the datagen modules are plain files next to this folder, not a package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
