"""The apps the tests run, in processes of their own or imported: each module says which test
runs it and how."""
