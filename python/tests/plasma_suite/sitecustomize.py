"""Put on PYTHONPATH by `make test-plasma`: every Python process of Plasma's
own test suite (pytest and the interpreters it starts) imports
ferroplasma.plasma when it asks for pyarrow.plasma."""

import ferroplasma._pyarrow_alias

ferroplasma._pyarrow_alias.install()
