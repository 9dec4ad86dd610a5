from sp00ky_infra.cli import main

main()
