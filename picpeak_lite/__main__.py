from picpeak_lite.cli import main

main()
